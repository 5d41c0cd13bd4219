#pragma once
// The GPU twin of ConvertOnHost (kv_convert.h): one kernel converts and scatters every piece of a
// conversion plan between two device buffers, bit for bit what the CPU routine writes (f32 ->
// bf16 rounds to nearest even, NaN stays a quiet NaN; bf16 -> f32 exact). Plain C++17 types so
// the .cu file needs no project headers beyond this one.
//
// Contract: `pieces` is a DEVICE array; every piece lies inside the buffers (the host wrapper in
// convert_on_device.h checks it); destinations of distinct pieces never overlap. Asynchronous on
// `stream`; no allocation.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::kvtransfer::cuda_convert {

struct DevicePiece {
  uint64_t src_offset;
  uint64_t dst_offset;
  uint64_t rows;
  uint64_t row_elems;
  uint64_t src_pitch;
  uint64_t dst_pitch;
};

// Element kinds: 1 = f32, 2 = bf16, 0 = raw bytes of `raw_bytes` each (same on both sides).
cudaError_t LaunchConvertPieces(const DevicePiece* pieces, int num_pieces, int src_kind,
                                int dst_kind, int raw_bytes, const void* src, void* dst,
                                cudaStream_t stream);

}  // namespace tandem::kvtransfer::cuda_convert
