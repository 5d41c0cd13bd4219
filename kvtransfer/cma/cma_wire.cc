#include "kvtransfer/cma/cma_wire.h"

#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::kvtransfer::cma {
namespace {

constexpr absl::string_view kVersion = "cma/1";
constexpr absl::string_view kEnd = "end";
constexpr size_t kMaxBlob = 512;
constexpr uint64_t kPidMaxLimit = uint64_t{1} << 22;

absl::Status Invalid(absl::string_view what, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("cma: ", std::string(what), ": ", std::string(why)));
}

// Strict decimal: 1..20 digits, no sign, no leading zero (except "0"), no overflow.
bool ParseDecimal(absl::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20 || (text.size() > 1 && text[0] == '0')) return false;
  uint64_t value = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    const uint64_t digit = static_cast<uint64_t>(c - '0');
    if (value > (UINT64_MAX - digit) / 10) return false;
    value = value * 10 + digit;
  }
  *out = value;
  return true;
}

bool ParseNonce(absl::string_view hex, Nonce* out) {
  if (hex.size() != 2 * kNonceBytes) return false;
  for (char c : hex) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) return false;
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  if (bytes.size() != kNonceBytes) return false;
  for (size_t i = 0; i < kNonceBytes; ++i) (*out)[i] = static_cast<uint8_t>(bytes[i]);
  return true;
}

// 8-4-4-4-12 lowercase hex, as the kernel writes it.
bool IsBootId(absl::string_view id) {
  if (id.size() != 36) return false;
  for (size_t i = 0; i < id.size(); ++i) {
    const char c = id[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
    } else if (!absl::ascii_isdigit(static_cast<unsigned char>(c)) && (c < 'a' || c > 'f')) {
      return false;
    }
  }
  return true;
}

// Splits "cma/1;k1=v1;...;kn=vn;end" whose keys must be exactly `keys`, in order; returns the
// values. The closing "end" makes every truncation (of a number too) malformed.
absl::StatusOr<std::vector<absl::string_view>> Values(absl::string_view blob,
                                                      absl::string_view what,
                                                      const std::vector<absl::string_view>& keys) {
  if (blob.size() > kMaxBlob) return Invalid(what, "blob too long");
  std::vector<absl::string_view> parts = absl::StrSplit(blob, ';');
  if (parts[0] != kVersion) return Invalid(what, "blob is not cma/1");
  if (parts.size() != keys.size() + 2 || parts.back() != kEnd) {
    return Invalid(what, absl::StrCat("blob is not ", keys.size(), " fields and 'end'"));
  }
  std::vector<absl::string_view> values;
  for (size_t i = 0; i < keys.size(); ++i) {
    const absl::string_view part = parts[i + 1];
    if (part.size() <= keys[i].size() || part.substr(0, keys[i].size()) != keys[i] ||
        part[keys[i].size()] != '=') {
      return Invalid(what, absl::StrCat("field ", i + 1, " is not '", std::string(keys[i]), "='"));
    }
    values.push_back(part.substr(keys[i].size() + 1));
  }
  return values;
}

}  // namespace

std::string EncodeAgentAddress(const AgentAddress& address) {
  return absl::StrCat(
      kVersion, ";boot=", address.boot_id, ";pid=", address.pid, ";start=", address.start_time,
      ";nonce_at=", address.nonce_address, ";nonce=",
      absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(address.nonce.data()),
                                               address.nonce.size())),
      ";", kEnd);
}

absl::StatusOr<AgentAddress> DecodeAgentAddress(absl::string_view blob) {
  constexpr absl::string_view kWhat = "agent address";
  auto values = Values(blob, kWhat, {"boot", "pid", "start", "nonce_at", "nonce"});
  if (!values.ok()) return values.status();
  AgentAddress a;
  if (!IsBootId((*values)[0])) return Invalid(kWhat, "bad boot id");
  a.boot_id = std::string((*values)[0]);
  uint64_t pid = 0;
  if (!ParseDecimal((*values)[1], &pid) || pid == 0 || pid > kPidMaxLimit) {
    return Invalid(kWhat, "bad pid");
  }
  a.pid = static_cast<uint32_t>(pid);
  if (!ParseDecimal((*values)[2], &a.start_time)) return Invalid(kWhat, "bad start time");
  if (!ParseDecimal((*values)[3], &a.nonce_address) || a.nonce_address == 0 ||
      a.nonce_address > UINT64_MAX - kNonceBytes) {
    return Invalid(kWhat, "bad nonce address");
  }
  if (!ParseNonce((*values)[4], &a.nonce)) return Invalid(kWhat, "bad nonce");
  return a;
}

std::string EncodeRegionBlob(const RegionBlob& region) {
  return absl::StrCat(kVersion, ";region=", region.id, ";base=", region.base,
                      ";length=", region.length, ";", kEnd);
}

absl::StatusOr<RegionBlob> DecodeRegionBlob(absl::string_view blob) {
  constexpr absl::string_view kWhat = "region";
  auto values = Values(blob, kWhat, {"region", "base", "length"});
  if (!values.ok()) return values.status();
  RegionBlob r;
  if (!ParseDecimal((*values)[0], &r.id)) return Invalid(kWhat, "bad region id");
  if (!ParseDecimal((*values)[1], &r.base) || r.base == 0) return Invalid(kWhat, "bad base");
  if (!ParseDecimal((*values)[2], &r.length) || r.length == 0 || r.base > UINT64_MAX - r.length) {
    return Invalid(kWhat, "bad length");
  }
  return r;
}

std::string ReadBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

absl::StatusOr<uint64_t> ParseStatStartTime(absl::string_view stat) {
  // "pid (comm) state ppid ..."; comm may contain anything, so fields count from the last ')'.
  const size_t close = stat.rfind(')');
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError("cma: /proc/<pid>/stat has no command name");
  }
  std::vector<absl::string_view> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state), so field 22 is fields[19].
  uint64_t start = 0;
  if (fields.size() < 20 || !ParseDecimal(absl::StripAsciiWhitespace(fields[19]), &start)) {
    return absl::InvalidArgumentError("cma: /proc/<pid>/stat has no start time");
  }
  return start;
}

absl::StatusOr<uint64_t> ReadProcessStartTime(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return absl::NotFoundError(absl::StrCat("cma: no process ", pid, " in /proc"));
  std::stringstream text;
  text << in.rdbuf();
  return ParseStatStartTime(text.str());
}

}  // namespace tandem::kvtransfer::cma
