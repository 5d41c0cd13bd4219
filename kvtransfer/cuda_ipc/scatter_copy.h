#pragma once
// The one copy kernel of the cuda_ipc backend: moves a list of byte ranges between device
// addresses (same GPU or a peer GPU mapped through CUDA IPC / peer access) in ONE launch, so a
// 4K-token prompt's 16,384 scattered 32 KiB blocks cost one kernel instead of 16,384
// cudaMemcpyAsync calls.
//
// Contract: `pieces` is a DEVICE array of `num_pieces` entries; every piece's source and
// destination lie in memory the launching device can read and write; pieces never overlap each
// other's destinations. Pieces whose addresses and length are all 16-byte aligned move with
// 16-byte vector accesses, others byte by byte. Host launcher; no allocation, asynchronous on
// `stream`. The host planner (ipc_plan.h: PlanPieces) builds the pieces from CopyOps.

#include <cuda_runtime_api.h>

#include "kvtransfer/cuda_ipc/copy_piece.h"

namespace tandem::kvtransfer::cuda_ipc {

// Launches the copy; returns the launch's error (cudaSuccess when queued).
cudaError_t LaunchScatterCopy(const CopyPiece* pieces, int num_pieces, int num_sms,
                              cudaStream_t stream);

}  // namespace tandem::kvtransfer::cuda_ipc
