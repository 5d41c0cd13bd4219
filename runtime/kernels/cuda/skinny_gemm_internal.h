#pragma once
// Private to tandem_kernels_cuda: the raw launcher of skinny_gemm.cu, which skinny_gemm_kernels.cc
// wraps with argument checks and the plan (skinny_gemm.h). Returns cudaGetLastError() after the
// launch.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::cuda::internal {

// Same values as kSkinnyGemmMaxRows / kSkinnyGemmKStep (skinny_gemm.h, which nvcc does not
// include: it pulls absl), and the kernel's tile geometry the plan is computed for.
constexpr int kSkinnyMaxRowsDevice = 64;
constexpr int kSkinnyKStepDevice = 64;
constexpr int kSkinnyTileRows = 64;  // weight rows per output tile (gated: 32 gate + 32 up)

struct SkinnyGemmRaw {
  const void* x;
  const void* w;
  const void* bias;
  void* out;
  bool out_f32;
  bool gated_silu;
  int m, n, k;
  int tiles, splits, k_per_split;
  float* partials;     // [splits][tiles][kSkinnyTileRows][m rounded up to 16], or null
  unsigned* counters;  // [tiles], or null when splits == 1
  // Rope mode (rope_head_dim > 0): n is the number of rotation pairs, out is the bf16 qkv buffer
  // [m, 2 n]; see SkinnyRope in skinny_gemm.h.
  int rope_head_dim;
  int rope_num_heads;
  int rope_num_kv_heads;
  const int32_t* rope_positions;
  const float* rope_inv_freq;
  const int32_t* rope_slots;
  void* rope_k_layer;
  void* rope_v_layer;
};

// Takes the wgmma kernel (skinny_gemm_sm90.cu) when use_wgmma (compute capability 9.0 only:
// SkinnyGemmWgmmaRunsHere), the mma.sync kernel (skinny_gemm.cu, every GPU) otherwise.
cudaError_t LaunchSkinnyGemmRaw(const SkinnyGemmRaw& args, bool use_wgmma, cudaStream_t stream);
// Whether the current device runs the wgmma kernel (compute capability 9.0).
bool SkinnyGemmWgmmaRunsHere();
// The wgmma kernel (sm_90a code: only on compute capability 9.0).
cudaError_t LaunchSkinnyGemmSm90Raw(const SkinnyGemmRaw& args, cudaStream_t stream);

}  // namespace tandem::cuda::internal
