#pragma once
// "nccl": the GPU-to-GPU backend between processes on any hosts (or two GPUs of one host where
// CUDA IPC cannot be used). Every (initiator = prefill, target = decode) pair gets its own
// two-rank NCCL communicator; KV moves as NCCL send/recv through a device staging buffer on
// each side (nccl_protocol.h has the protocol, nccl_channel.h the NCCL side).
//
// Pairing (two-sided, over the control plane):
//   target:    address = LocalAddress()   (boot id, host, GPU UUID, a random per-process token,
//                                          its staging cap; never a memory address)
//   initiator: Connect(target, address)   (makes an ncclUniqueId and a random 128-bit pairing
//                                          secret, starts rank 0; returns at once)
//              reply = ConnectReply(target)  -> carried to the target
//   target:    Accept(initiator, reply)   (checks the reply names this process's token, starts
//                                          rank 1; returns at once)
//   Both sides finish set-up in the background and poll it from Poll/Progress; past
//   options.connect_timeout the communicator is aborted (ncclCommAbort) on that side.
//   A region blob (ExportRegion) names the target's region by id and length plus its token; the
//   target checks every op against what it registered (kvtransfer/copy_ops.h).
//
// - Memory: device memory of the backend's GPU (MemoryKind::kCuda) on both sides.
// - PostWrite returns at once; a write posted before the communicator is ready waits for it.
//   Ops are gathered into staging with one kernel and sent as ONE message (a transfer larger
//   than the smaller of both staging caps, options.nccl_staging_bytes, goes as several
//   messages); the target scatters each with one kernel and acknowledges it. Poll reports kDone
//   once every message's ack arrived (remote completion); the target then hands the
//   notification to GetNotifications (the target must call Progress or GetNotifications
//   regularly: it posts the receives).
// - Failure: a transfer not done within options.transfer_timeout, an error from NCCL, anything
//   malformed from the peer, or Release of a transfer in flight aborts the pair's communicator
//   and fails every transfer on it (logged once per pair). The pair then refuses new writes
//   with FailedPrecondition until Disconnect + Connect (+ Accept on the target) pair it again;
//   Connect with the same address after such a failure starts a new communicator (call
//   ConnectReply again).
// - Release of a transfer in flight aborts the communicator: afterwards nothing of it is sent
//   any more; a message whose data had fully reached the target may still be scattered there
//   (one local kernel). Disconnect aborts the peer's communicators (both roles).
// - While a target pair is idle a header receive stays posted on its stream: a device-wide
//   synchronization in the target process (cudaDeviceSynchronize) would wait for the next
//   message. The backend itself only uses stream-ordered frees while pairs exist.
//
// Threading: like every backend, one thread makes every call (each call sets the backend's
// device first).

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

// Unavailable when options.nccl_library cannot be loaded ("nccl: libnccl.so.2 not found: ...")
// or no CUDA device can be used, NotFound for a bad options.cuda_device, FailedPrecondition for
// an NCCL older than 2.19.
absl::StatusOr<std::unique_ptr<TransferBackend>> CreateNcclBackend(const BackendOptions& options);

}  // namespace tandem::kvtransfer
