#include "kvtransfer/cuda_ipc/ipc_wire.h"

#include <fstream>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace tandem::kvtransfer::cuda_ipc {
namespace {

constexpr absl::string_view kVersion = "cuda_ipc/1";
constexpr size_t kMaxBlob = 1024;

template <size_t N>
std::string Hex(const std::array<uint8_t, N>& bytes) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
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

// Splits "cuda_ipc/1;k=v;..." into fields; exactly `keys` must be present, once each.
absl::StatusOr<absl::flat_hash_map<std::string, std::string>> Fields(
    absl::string_view blob, absl::string_view what, const std::vector<absl::string_view>& keys) {
  if (blob.size() > kMaxBlob) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: ", what, " blob too long"));
  }
  std::vector<absl::string_view> parts = absl::StrSplit(blob, ';');
  if (parts.empty() || parts[0] != kVersion) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: ", what, " blob is not ", kVersion));
  }
  absl::flat_hash_map<std::string, std::string> fields;
  for (size_t i = 1; i < parts.size(); ++i) {
    std::vector<absl::string_view> kv = absl::StrSplit(parts[i], absl::MaxSplits('=', 1));
    if (kv.size() != 2 || !fields.emplace(kv[0], kv[1]).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: ", what, " blob: malformed or repeated field '", parts[i], "'"));
    }
  }
  for (absl::string_view key : keys) {
    if (!fields.contains(key)) {
      return absl::InvalidArgumentError(
          absl::StrCat("cuda_ipc: ", what, " blob lacks '", key, "'"));
    }
  }
  if (fields.size() != keys.size()) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc: ", what, " blob has unknown fields"));
  }
  return fields;
}

}  // namespace

uint64_t ProcessNonce() {
  static const uint64_t nonce = [] {
    std::random_device rd;
    uint64_t n = 0;
    while (n == 0) n = (static_cast<uint64_t>(rd()) << 32) ^ rd();
    return n;
  }();
  return nonce;
}

std::string EncodeAgentAddress(const AgentAddress& address) {
  return absl::StrCat(kVersion, ";boot=", address.boot_id, ";pid=", address.pid,
                      ";proc=", absl::Hex(address.process, absl::kZeroPad16),
                      ";gpu=", Hex(address.gpu));
}

absl::StatusOr<AgentAddress> DecodeAgentAddress(absl::string_view blob) {
  auto fields = Fields(blob, "agent address", {"boot", "pid", "proc", "gpu"});
  if (!fields.ok()) return fields.status();
  AgentAddress a;
  a.boot_id = (*fields)["boot"];
  if (a.boot_id.empty() || a.boot_id.size() > 64) {
    return absl::InvalidArgumentError("cuda_ipc: agent address: bad boot id");
  }
  if (!absl::SimpleAtoi((*fields)["pid"], &a.pid) || a.pid == 0) {
    return absl::InvalidArgumentError("cuda_ipc: agent address: bad pid");
  }
  const std::string& proc = (*fields)["proc"];
  if (proc.size() != 16 || !absl::SimpleHexAtoi(proc, &a.process) || a.process == 0) {
    return absl::InvalidArgumentError("cuda_ipc: agent address: bad process nonce");
  }
  if (!FromHex((*fields)["gpu"], &a.gpu)) {
    return absl::InvalidArgumentError("cuda_ipc: agent address: bad gpu UUID");
  }
  return a;
}

std::string EncodeRegionBlob(const RegionBlob& region) {
  return absl::StrCat(kVersion, ";handle=", Hex(region.handle), ";offset=", region.offset,
                      ";length=", region.length, ";gpu=", Hex(region.gpu));
}

absl::StatusOr<RegionBlob> DecodeRegionBlob(absl::string_view blob) {
  auto fields = Fields(blob, "region", {"handle", "offset", "length", "gpu"});
  if (!fields.ok()) return fields.status();
  RegionBlob r;
  if (!FromHex((*fields)["handle"], &r.handle)) {
    return absl::InvalidArgumentError("cuda_ipc: region: bad IPC handle");
  }
  if (!absl::SimpleAtoi((*fields)["offset"], &r.offset) ||
      !absl::SimpleAtoi((*fields)["length"], &r.length) || r.length == 0 ||
      r.offset > UINT64_MAX - r.length) {
    return absl::InvalidArgumentError("cuda_ipc: region: bad offset or length");
  }
  if (!FromHex((*fields)["gpu"], &r.gpu)) {
    return absl::InvalidArgumentError("cuda_ipc: region: bad gpu UUID");
  }
  return r;
}

std::string ReadBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return std::string(absl::StripAsciiWhitespace(id));
}

}  // namespace tandem::kvtransfer::cuda_ipc
