#pragma once
// "cuda_ipc": the same-host GPU backend. Moves KV between device memory of two processes (or two
// agents of one process) on one host, over the same GPU or a peer GPU reached by NVLink or PCIe
// peer access, with no host staging.
//
// - Memory: RegisterMemory takes device memory only (MemoryKind::kCuda, on the backend's GPU,
//   inside one cudaMalloc allocation). ExportRegion names a CUDA IPC handle of that WHOLE
//   allocation plus the registered range's offset and length (ipc_wire.h).
// - Connect checks the peer is on this host (boot id), that its GPU is visible here and, for
//   another GPU, that peer access is possible; otherwise FailedPrecondition saying why.
// - The first PostWrite naming a remote region opens its IPC handle (cudaIpcOpenMemHandle; an
//   agent of the same process resolves it without the driver) and caches the mapping until
//   Disconnect. The region's claimed offset and length are checked against the size the driver
//   mapped, so a peer cannot make us write outside its allocation. A handle the driver rejects
//   (containers without a shared IPC namespace, a peer that exited) is FailedPrecondition.
// - PostWrite moves all ops with ONE scatter-copy kernel (scatter_copy.h) on the backend's own
//   stream; Poll queries the transfer's event and never blocks. A kernel cannot be recalled, so
//   Release of a transfer still running waits for its kernel (bounded: one copy of at most the
//   region's bytes, well under a millisecond per 512 MiB): after Release nothing of it is in
//   flight, which is what lets the sender fence a failed transfer.
// - No notifications: the initiator acknowledges over the control plane once Poll says kDone.
//
// Threading: like every backend, one thread makes every call (it sets the backend's device
// first). Failure modes are in each method's comment in transfer_backend.h.

#include <memory>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

// Unavailable when no CUDA device can be used (no GPU, no driver), NotFound for a bad
// options.cuda_device.
absl::StatusOr<std::unique_ptr<TransferBackend>> CreateCudaIpcBackend(
    const BackendOptions& options);

}  // namespace tandem::kvtransfer
