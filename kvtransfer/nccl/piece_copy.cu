#include "kvtransfer/nccl/piece_copy.h"

namespace tandem::kvtransfer::nccl {
namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

__global__ void PieceCopyKernel(const CopyPiece* __restrict__ pieces, int num_pieces) {
  for (int p = blockIdx.x; p < num_pieces; p += gridDim.x) {
    const CopyPiece piece = pieces[p];
    if (((piece.src | piece.dst | piece.bytes) & 15) == 0) {
      const uint4* src = reinterpret_cast<const uint4*>(piece.src);
      uint4* dst = reinterpret_cast<uint4*>(piece.dst);
      const uint64_t n = piece.bytes / 16;
      uint64_t i = threadIdx.x;
      for (; i + (kUnroll - 1) * kThreads < n; i += kUnroll * kThreads) {
        uint4 v[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) v[u] = src[i + u * kThreads];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) dst[i + u * kThreads] = v[u];
      }
      for (; i < n; i += kThreads) dst[i] = src[i];
    } else {
      const unsigned char* src = reinterpret_cast<const unsigned char*>(piece.src);
      unsigned char* dst = reinterpret_cast<unsigned char*>(piece.dst);
      for (uint64_t i = threadIdx.x; i < piece.bytes; i += kThreads) dst[i] = src[i];
    }
  }
}

}  // namespace

cudaError_t LaunchPieceCopy(const CopyPiece* pieces, int num_pieces, int num_sms,
                            cudaStream_t stream) {
  if (num_pieces <= 0) return cudaSuccess;
  const int grid = num_pieces < num_sms * 4 ? num_pieces : num_sms * 4;
  PieceCopyKernel<<<grid, kThreads, 0, stream>>>(pieces, num_pieces);
  return cudaGetLastError();
}

}  // namespace tandem::kvtransfer::nccl
