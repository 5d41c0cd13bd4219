#pragma once
// The cuda_ipc backend's two blobs, parsed and validated here with no CUDA types (unit-tested
// without a GPU). Both are text, versioned "cuda_ipc/1", fields separated by ';':
//   agent address: cuda_ipc/1;boot=<host boot id>;pid=<pid>;proc=<16 hex: process nonce>;
//                  gpu=<32 hex: device UUID>
//   region:        cuda_ipc/1;handle=<128 hex: cudaIpcMemHandle_t>;offset=<N>;length=<N>;
//                  gpu=<32 hex>
// A region blob names an IPC handle of a whole device allocation and the registered range inside
// it. Its offset and length are claims, not trusted: the backend that opens the handle checks them
// against the size of the allocation the driver actually mapped.
//
// Thread-safety: stateless functions.

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::kvtransfer::cuda_ipc {

inline constexpr size_t kIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)
inline constexpr size_t kUuidBytes = 16;       // sizeof(cudaUUID_t)

struct AgentAddress {
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: same value = same host (and boot)
  uint32_t pid = 0;     // in the agent's own PID namespace (for messages only)
  // ProcessNonce() of the agent's process: the same value = the same process. A pid cannot say
  // that: two containers on one host each run their worker as pid 1.
  uint64_t process = 0;
  std::array<uint8_t, kUuidBytes> gpu{};
};

// A random number drawn once per process (thread-safe).
uint64_t ProcessNonce();

struct RegionBlob {
  std::array<uint8_t, kIpcHandleBytes> handle{};
  uint64_t offset = 0;  // of the registered range inside the allocation
  uint64_t length = 0;
  std::array<uint8_t, kUuidBytes> gpu{};
};

std::string EncodeAgentAddress(const AgentAddress& address);
// InvalidArgument, naming what is wrong, for anything but a well-formed version-1 address.
absl::StatusOr<AgentAddress> DecodeAgentAddress(absl::string_view blob);

std::string EncodeRegionBlob(const RegionBlob& region);
absl::StatusOr<RegionBlob> DecodeRegionBlob(absl::string_view blob);

// This host's boot id (trimmed), or "" when it cannot be read.
std::string ReadBootId();

}  // namespace tandem::kvtransfer::cuda_ipc
