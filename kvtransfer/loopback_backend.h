#pragma once
// The in-process reference backend. Agents in one process find each other through a process-wide
// registry keyed by agent name; LocalAddress() is the agent name; an exported region is the blob
// (agent, region id, base, length). PostWrite/PostRead copy with memcpy at once and deliver the
// notification into the target agent's queue before returning; Poll then reports kDone.
//
// Ownership and threading: as TransferBackend (one owning thread per backend). Different agents
// may be owned by different threads: the registry and each agent's region table and notification
// queue are mutex-guarded, and a notification is queued after its bytes are copied, so a target
// that sees it also sees the bytes. Creating a second live agent with the same name fails
// (AlreadyExists); destroying an agent unregisters it, and later writes to it fail with NotFound.

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateLoopbackBackend(
    const BackendOptions& options);

}  // namespace tandem::kvtransfer
