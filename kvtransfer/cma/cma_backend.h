#pragma once
// The cma backend: writes into (reads from) a peer process's registered host memory on the same
// host with process_vm_writev (process_vm_readv) (cross-memory attach: one copy, kernel to
// kernel, no shared mapping, no progress needed on the peer). Callers go through
// CreateTransferBackend("cma", ...) in kvtransfer/transfer_backend.h.
//
// Mechanics: PostWrite checks the request (regions, bounds: copy_ops.h), splits its ops into
// BackendOptions::cma_threads shares of about equal bytes (ops straddling a share are split) and
// hands them to that many copy threads the backend owns; each writes its share sorted by
// destination (adjacent blocks merge into one remote iovec) in calls of at most IOV_MAX iovecs a
// side and 16 MiB. Ops of one transfer whose destinations overlap land in no defined order. Poll
// reads the transfer's atomics (never blocks); kDone means every call returned every byte, so the
// bytes are in the target's memory. Release of a running transfer cancels what has not started and
// waits for the calls in flight (memory copies of at most 16 MiB each), so nothing lingers.
// PostRead is the same with the direction turned: the ops' remote ranges are read into the local
// ones (the MLP shards' host data plane, where each side reads what the other exported and
// nobody writes into another process). Host memory only; no notifications (the product
// acknowledges over gRPC; capabilities().notifications is false and a post with one is refused).
//
// Trust: the peer's address blob (cma_wire.h) is a claim. Connect refuses another host's boot id,
// a pid whose start time differs (pid reuse), and a pid whose memory does not hold the 16-byte
// random nonce at the claimed address (a forged pid naming some other process of this user);
// every PostWrite reads the nonce again before it posts, so a peer that died (or whose pid was
// reused) fails the transfer (kFailed) instead of writing into a stranger. Writes never leave the
// remote region as its blob describes it. The kernel's own check applies too: the caller needs
// ptrace access to the peer (same user and /proc/sys/kernel/yama/ptrace_scope 0, or
// CAP_SYS_PTRACE), and both in one pid namespace.
//
// Threading: as TransferBackend. The owning thread makes every call; the copy threads only run
// posted shares and touch nothing else of the backend.

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

// InvalidArgument for cma_threads outside 1..64; Unavailable when /dev/urandom or the boot id
// cannot be read.
absl::StatusOr<std::unique_ptr<TransferBackend>> CreateCmaBackend(const BackendOptions& options);

}  // namespace tandem::kvtransfer
