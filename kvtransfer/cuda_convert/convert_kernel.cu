#include <cstdint>

#include "kvtransfer/cuda_convert/convert_kernel.h"

namespace tandem::kvtransfer::cuda_convert {
namespace {

__device__ __forceinline__ uint16_t ToBf16(uint32_t u) {
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow carries into inf
  return static_cast<uint16_t>(u >> 16);
}

// One CTA per piece (grid-stride over pieces), its threads over the piece's elements.
__global__ void ConvertPiecesKernel(const DevicePiece* pieces, int num_pieces, int src_kind,
                                    int dst_kind, int raw_bytes, const char* src, char* dst) {
  for (int p = blockIdx.x; p < num_pieces; p += gridDim.x) {
    const DevicePiece piece = pieces[p];
    const uint64_t total = piece.rows * piece.row_elems;
    for (uint64_t e = threadIdx.x; e < total; e += blockDim.x) {
      const uint64_t r = e / piece.row_elems;
      const uint64_t c = e - r * piece.row_elems;
      const char* s = src + piece.src_offset + r * piece.src_pitch;
      char* d = dst + piece.dst_offset + r * piece.dst_pitch;
      if (src_kind == 1 && dst_kind == 1) {
        reinterpret_cast<uint32_t*>(d)[c] = reinterpret_cast<const uint32_t*>(s)[c];
      } else if (src_kind == 2 && dst_kind == 2) {
        reinterpret_cast<uint16_t*>(d)[c] = reinterpret_cast<const uint16_t*>(s)[c];
      } else if (src_kind == 2 && dst_kind == 1) {
        reinterpret_cast<uint32_t*>(d)[c] =
            static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(s)[c]) << 16;
      } else if (src_kind == 1 && dst_kind == 2) {
        reinterpret_cast<uint16_t*>(d)[c] = ToBf16(reinterpret_cast<const uint32_t*>(s)[c]);
      } else {
        for (int b = 0; b < raw_bytes; ++b) d[c * raw_bytes + b] = s[c * raw_bytes + b];
      }
    }
  }
}

}  // namespace

cudaError_t LaunchConvertPieces(const DevicePiece* pieces, int num_pieces, int src_kind,
                                int dst_kind, int raw_bytes, const void* src, void* dst,
                                cudaStream_t stream) {
  if (num_pieces <= 0) return cudaSuccess;
  const int blocks = num_pieces < 65535 ? num_pieces : 65535;
  ConvertPiecesKernel<<<blocks, 256, 0, stream>>>(pieces, num_pieces, src_kind, dst_kind, raw_bytes,
                                                  static_cast<const char*>(src),
                                                  static_cast<char*>(dst));
  return cudaGetLastError();
}

}  // namespace tandem::kvtransfer::cuda_convert
