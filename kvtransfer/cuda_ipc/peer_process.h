#pragma once
// Spawns kvtransfer's cuda_ipc_peer (cuda_ipc_peer.cc) and talks to it line by line: the
// cross-process GPU test and bench/kv_ipc_bench share this. Every read has a deadline (a peer
// that hangs fails the caller, it never hangs it); the destructor sends "quit", then kills the
// child if it has not exited within a second.
//
// Thread-safety: one thread uses an object.

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::cuda_ipc {

class PeerProcess {
 public:
  // Starts `binary --bytes N --device D` and reads its address and region lines.
  static absl::StatusOr<std::unique_ptr<PeerProcess>> Start(const std::string& binary,
                                                            uint64_t bytes, int device,
                                                            absl::Duration timeout);
  ~PeerProcess();

  const std::string& address() const { return address_; }
  const std::string& region() const { return region_; }
  // Sends one command line and returns the answer line (without the newline).
  absl::StatusOr<std::string> Command(const std::string& command, absl::Duration timeout);

 private:
  PeerProcess() = default;
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);

  pid_t pid_ = -1;
  int to_child_ = -1;
  int from_child_ = -1;
  std::string buffered_;
  std::string address_, region_;
};

}  // namespace tandem::kvtransfer::cuda_ipc
