#pragma once
// The nccl backend's one copy kernel: moves a list of byte ranges between device addresses of
// this GPU (region <-> staging buffer) in ONE launch, so a message gathers (initiator) or
// scatters (target) all its KV blocks with one kernel instead of one copy per block.
//
// Contract: `pieces` is a DEVICE array of `num_pieces` entries (cuda_ipc's CopyPiece POD:
// src, dst, bytes, each at most kMaxPieceBytes for balance); destinations never overlap.
// 16-byte aligned pieces move with vector accesses. Asynchronous on `stream`; no allocation.

#include <cuda_runtime_api.h>

#include "kvtransfer/cuda_ipc/copy_piece.h"

namespace tandem::kvtransfer::nccl {

using cuda_ipc::CopyPiece;
using cuda_ipc::kMaxPieceBytes;

// Returns the launch's error (cudaSuccess when queued; nothing is launched for 0 pieces).
cudaError_t LaunchPieceCopy(const CopyPiece* pieces, int num_pieces, int num_sms,
                            cudaStream_t stream);

}  // namespace tandem::kvtransfer::nccl
