#pragma once
// The cma backend's two blobs and the /proc facts it checks a peer against, with no syscalls
// beyond reading /proc (unit-tested without a peer). Both blobs are text, versioned "cma/1",
// fields in this exact order, separated by ';', numbers in decimal, closed by "end" (so that no
// truncation is well-formed):
//   agent address: cma/1;boot=<host boot id>;pid=<pid>;start=<process start time>;
//                  nonce_at=<address of the identity nonce>;nonce=<32 hex: the nonce>;end
//   region:        cma/1;region=<id>;base=<address>;length=<bytes>;end
// Everything in them comes from the peer and is a claim: the backend checks the boot id against
// its own, the start time against /proc/<pid>/stat, and reads the nonce out of that pid's memory
// at nonce_at before it believes the pid is the peer (cma_backend.h).
//
// Thread-safety: stateless functions.

#include <sys/types.h>

#include <array>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem::kvtransfer::cma {

inline constexpr size_t kNonceBytes = 16;
using Nonce = std::array<uint8_t, kNonceBytes>;

struct AgentAddress {
  std::string boot_id;      // /proc/sys/kernel/random/boot_id: same value = same host (and boot)
  uint32_t pid = 0;         // 1 .. 2^22 (PID_MAX_LIMIT)
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat (clock ticks after boot)
  uint64_t nonce_address = 0;
  Nonce nonce{};
};

struct RegionBlob {
  uint64_t id = 0;  // the target backend's region id
  uint64_t base = 0;
  uint64_t length = 0;  // > 0, base + length does not overflow
};

std::string EncodeAgentAddress(const AgentAddress& address);
// InvalidArgument, naming what is wrong, for anything but a well-formed version-1 address.
absl::StatusOr<AgentAddress> DecodeAgentAddress(absl::string_view blob);

std::string EncodeRegionBlob(const RegionBlob& region);
absl::StatusOr<RegionBlob> DecodeRegionBlob(absl::string_view blob);

// This host's boot id (trimmed), or "" when it cannot be read.
std::string ReadBootId();

// Field 22 (starttime) of /proc/<pid>/stat: with the pid, it names one process for the life of
// the boot (a reused pid has a later start time). NotFound when there is no such process (or it
// is outside this pid namespace), InvalidArgument for a stat line that does not parse.
absl::StatusOr<uint64_t> ReadProcessStartTime(pid_t pid);
// The same, parsed from the text of a stat file (the command name may hold spaces and ')').
absl::StatusOr<uint64_t> ParseStatStartTime(absl::string_view stat);

}  // namespace tandem::kvtransfer::cma
