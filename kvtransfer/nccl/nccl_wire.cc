#include "kvtransfer/nccl/nccl_wire.h"

#include <fstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::kvtransfer::nccl {
namespace {

constexpr absl::string_view kVersion = "nccl/1";
constexpr size_t kMaxBlob = 1024;

template <size_t N>
std::string Hex(const std::array<uint8_t, N>& bytes) {
  return HexString(bytes.data(), bytes.size());
}

template <size_t N>
bool FromHex(absl::string_view hex, std::array<uint8_t, N>* out) {
  if (hex.size() != 2 * N) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  const std::string bytes = absl::HexStringToBytes(hex);
  if (bytes.size() != N) return false;
  for (size_t i = 0; i < N; ++i) (*out)[i] = static_cast<uint8_t>(bytes[i]);
  return true;
}

bool Decimal(absl::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 20) return false;
  for (char c : text) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// Splits "nccl/1;k=v;..." into fields; exactly `keys` must be present, once each.
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> Fields(
    absl::string_view blob, absl::string_view what, const std::vector<absl::string_view>& keys) {
  if (blob.size() > kMaxBlob) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", what, " blob too long"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(blob, ';');
  if (parts.empty() || parts[0] != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", what, " blob is not ", kVersion));
  }
  absl::flat_hash_map<std::string, std::string> fields;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::vector<absl::string_view> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    if (kv.size() != 2 || !fields.emplace(kv[0], kv[1]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("nccl: ", what, " blob: malformed or repeated field '", parts[i], "'"));
    }
  }
  for (absl::string_view key : keys) {
    if (!fields.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("nccl: ", what, " blob lacks '", key, "'"));
    }
  }
  if (fields.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", what, " blob has unknown fields"));
  }
  return fields;
}

void Put16(std::string& out, size_t at, uint16_t v) {
  for (int i = 0; i < 2; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
void Put32(std::string& out, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
void Put64(std::string& out, size_t at, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[at + i] = static_cast<char>(v >> (8 * i));
}
uint64_t Get(absl::string_view in, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(in[at + i])) << (8 * i);
  }
  return v;
}
void PutSecret(std::string& out, size_t at, const Secret& s) {
  for (size_t i = 0; i < kSecretBytes; ++i) out[at + i] = static_cast<char>(s[i]);
}
Secret GetSecret(absl::string_view in, size_t at) {
  Secret s;
  for (size_t i = 0; i < kSecretBytes; ++i) s[i] = static_cast<uint8_t>(in[at + i]);
  return s;
}

// The common start of headers and acks: magic, version, reserved.
absl::Status CheckFraming(absl::string_view bytes, size_t size, uint32_t magic,
                          absl::string_view what) {
  if (bytes.size() != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: ", what, " of ", bytes.size(), " bytes (expected ", size, ")"));
  }
  if (Get(bytes, 0, 4) != magic) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", what, " has a bad magic"));
  }
  if (Get(bytes, 4, 2) != kWireVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        "nccl: ", what, " has wire version ", Get(bytes, 4, 2), " (expected ", kWireVersion, ")"));
  }
  if (Get(bytes, 6, 2) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: ", what, " has reserved bits set"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string HexString(const uint8_t* bytes, size_t size) {
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(bytes), size));
}

std::string EncodeAgentAddress(const AgentAddress& a) {
  return absl::StrCat(kVersion, ";boot=", a.boot_id, ";host=", a.host, ";gpu=", Hex(a.gpu),
                      ";token=", Hex(a.token), ";staging=", a.staging_bytes);
}

absl::StatusOr<AgentAddress> DecodeAgentAddress(absl::string_view blob) {
  auto fields = Fields(blob, "agent address", {"boot", "host", "gpu", "token", "staging"});
  if (!fields.ok()) return fields.status();
  AgentAddress a;
  a.boot_id = (*fields)["boot"];
  a.host = (*fields)["host"];
  if (a.boot_id.empty() || a.boot_id.size() > 64) {
    return absl::InvalidArgumentError("nccl: agent address: bad boot id");
  }
  if (a.host.size() > 255) return absl::InvalidArgumentError("nccl: agent address: bad host");
  if (!FromHex((*fields)["gpu"], &a.gpu)) {
    return absl::InvalidArgumentError("nccl: agent address: bad gpu UUID");
  }
  if (!FromHex((*fields)["token"], &a.token)) {
    return absl::InvalidArgumentError("nccl: agent address: bad token");
  }
  if (!Decimal((*fields)["staging"], &a.staging_bytes) || a.staging_bytes == 0) {
    return absl::InvalidArgumentError("nccl: agent address: bad staging size");
  }
  return a;
}

std::string EncodeConnectReply(const ConnectReply& r) {
  return absl::StrCat(kVersion, ";id=", Hex(r.unique_id), ";secret=", Hex(r.secret),
                      ";token=", Hex(r.target_token));
}

absl::StatusOr<ConnectReply> DecodeConnectReply(absl::string_view blob) {
  auto fields = Fields(blob, "connect reply", {"id", "secret", "token"});
  if (!fields.ok()) return fields.status();
  ConnectReply r;
  if (!FromHex((*fields)["id"], &r.unique_id)) {
    return absl::InvalidArgumentError("nccl: connect reply: bad unique id");
  }
  if (!FromHex((*fields)["secret"], &r.secret)) {
    return absl::InvalidArgumentError("nccl: connect reply: bad secret");
  }
  if (!FromHex((*fields)["token"], &r.target_token)) {
    return absl::InvalidArgumentError("nccl: connect reply: bad token");
  }
  return r;
}

std::string EncodeRegionBlob(const RegionBlob& r) {
  return absl::StrCat(kVersion, ";token=", Hex(r.token), ";region=", r.region,
                      ";length=", r.length);
}

absl::StatusOr<RegionBlob> DecodeRegionBlob(absl::string_view blob) {
  auto fields = Fields(blob, "region", {"token", "region", "length"});
  if (!fields.ok()) return fields.status();
  RegionBlob r;
  if (!FromHex((*fields)["token"], &r.token)) {
    return absl::InvalidArgumentError("nccl: region: bad token");
  }
  if (!Decimal((*fields)["region"], &r.region) || !Decimal((*fields)["length"], &r.length) ||
      r.length == 0) {
    return absl::InvalidArgumentError("nccl: region: bad id or length");
  }
  return r;
}

std::string EncodeHeader(const MessageHeader& h) {
  std::string out(kHeaderBytes, '\0');
  Put32(out, 0, kHeaderMagic);
  Put16(out, 4, kWireVersion);
  Put64(out, 8, h.sequence);
  PutSecret(out, 16, h.secret);
  Put64(out, 32, h.region);
  Put64(out, 40, h.op_count);
  Put64(out, 48, h.data_bytes);
  Put32(out, 56, h.notification_bytes);
  return out;
}

absl::StatusOr<MessageHeader> DecodeHeader(absl::string_view bytes) {
  if (absl::Status s = CheckFraming(bytes, kHeaderBytes, kHeaderMagic, "message header"); !s.ok()) {
    return s;
  }
  if (Get(bytes, 60, 4) != 0) {
    return absl::InvalidArgumentError("nccl: message header has unknown flags");
  }
  MessageHeader h;
  h.sequence = Get(bytes, 8, 8);
  h.secret = GetSecret(bytes, 16);
  h.region = Get(bytes, 32, 8);
  h.op_count = Get(bytes, 40, 8);
  h.data_bytes = Get(bytes, 48, 8);
  h.notification_bytes = static_cast<uint32_t>(Get(bytes, 56, 4));
  return h;
}

std::string EncodeAck(const Ack& a) {
  std::string out(kAckBytes, '\0');
  Put32(out, 0, kAckMagic);
  Put16(out, 4, kWireVersion);
  Put64(out, 8, a.sequence);
  PutSecret(out, 16, a.secret);
  return out;
}

absl::StatusOr<Ack> DecodeAck(absl::string_view bytes) {
  if (absl::Status s = CheckFraming(bytes, kAckBytes, kAckMagic, "ack"); !s.ok()) return s;
  Ack a;
  a.sequence = Get(bytes, 8, 8);
  a.secret = GetSecret(bytes, 16);
  return a;
}

std::string EncodeControl(const std::vector<WireOp>& ops, absl::string_view notification) {
  std::string out(ops.size() * kWireOpBytes + notification.size(), '\0');
  for (size_t i = 0; i < ops.size(); ++i) {
    Put64(out, i * kWireOpBytes, ops[i].remote_offset);
    Put64(out, i * kWireOpBytes + 8, ops[i].length);
  }
  if (!notification.empty()) {
    out.replace(ops.size() * kWireOpBytes, notification.size(), notification.data(),
                notification.size());
  }
  return out;
}

absl::Status DecodeControl(absl::string_view bytes, uint64_t op_count, uint32_t notification_bytes,
                           std::vector<WireOp>* ops, std::string* notification) {
  if (op_count > kMaxOpsPerMessage ||
      bytes.size() != op_count * kWireOpBytes + notification_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: op list of ", bytes.size(),
                                                   " bytes does not hold ", op_count, " ops and a ",
                                                   notification_bytes, "-byte notification"));
  }
  ops->resize(op_count);
  for (uint64_t i = 0; i < op_count; ++i) {
    (*ops)[i].remote_offset = Get(bytes, i * kWireOpBytes, 8);
    (*ops)[i].length = Get(bytes, i * kWireOpBytes + 8, 8);
  }
  notification->assign(std::string(bytes.substr(op_count * kWireOpBytes)));
  return absl::OkStatus();
}

bool SameSecret(const Secret& a, const Secret& b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < kSecretBytes; ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

absl::StatusOr<Secret> RandomSecret() {
  std::ifstream in("/dev/urandom", std::ios::binary);
  Secret s;
  if (!in.read(reinterpret_cast<char*>(s.data()), s.size())) {
    return absl::UnavailableError("nccl: cannot read /dev/urandom");
  }
  return s;
}

std::string ReadBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

}  // namespace tandem::kvtransfer::nccl
