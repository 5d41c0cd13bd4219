#pragma once
// The UCX backend: one-sided puts/gets over UCP (tcp, shared memory, RDMA where present).
// UCX headers stay private to kvtransfer/ucx/ucx_backend.cc and the tandem_kvtransfer_ucx
// target; callers go through CreateTransferBackend("ucx", ...) in kvtransfer/transfer_backend.h.
//
// Mechanics: one ucp context (features RMA | AM) and one ucp worker in UCS_THREAD_MODE_SINGLE;
// LocalAddress() is "tandem-ucx/1 <boot id> <pid>\n" followed by the worker address; a region
// blob is {magic, base, length, packed rkey}. Connect (InvalidArgument for any other address)
// creates an endpoint in error-handling mode PEER (a dead peer becomes an error), except for a
// peer on the same host (same boot id) when shared-memory transports are allowed: UCX 1.13 leaves
// posix/sysv/cma out of endpoints with error handling, so such a peer gets none, and its death is
// seen by its pid instead (checked every 10 ms while a transfer to it waits; the transfer then
// fails, and its stuck requests are handed back to UCX once the endpoint is force-closed).
// Connect waits, up to BackendOptions::connect_timeout, for the wireup (the peer must be
// progressing meanwhile);
// PostWrite issues one ucp_put_nbx per CopyOp and an endpoint flush; once the flush completes
// (remote completion) the notification goes out as a UCP active message, and Poll reports kDone
// when that send completed too. Rkeys are unpacked once per (peer, region blob) and cached.
// Releasing an unfinished transfer cancels what UCX lets us cancel; requests still in flight are
// kept (invisibly) until they complete, and DeregisterMemory of their region waits for them a
// bounded time, then fails with FailedPrecondition.
//
// Threading: as TransferBackend; every UCX call happens on the owning thread (notifications are
// received inside Progress/Poll/GetNotifications on that thread).

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateUcxBackend(const BackendOptions& options);

}  // namespace tandem::kvtransfer
