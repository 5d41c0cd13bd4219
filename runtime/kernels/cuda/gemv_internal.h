#pragma once
// Private to tandem_kernels_cuda: the raw GEMV launchers of gemv.cu, which gemv_kernels.cc and
// model_kernels.cc wrap with argument checks (gemv_kernels.h preconditions: 1 <= m <= kGemvMaxRows,
// k % 8 == 0, x, w and norm_weight 16-byte aligned, non-null pointers). Return cudaGetLastError()
// after the launch, or cudaErrorInvalidValue for a combination the kernels do not take.

#include <cuda_runtime_api.h>

#include <cstdint>

namespace tandem::cuda::internal {

// Same value as kGemvMaxRows (gemv_kernels.h, which nvcc does not include: it pulls absl).
constexpr int kGemvMaxRowsDevice = 8;

// The fusions of gemv_kernels.h's GemvArgs: RMSNorm folded in (norm_weight non-null) and the
// residual epilogue (add_to_out: plain mode with bf16 output only).
struct GemvFusion {
  const void* norm_weight = nullptr;
  float norm_eps = 0.0f;
  bool add_to_out = false;
};

// Launch shape knobs (A/B switches, read once from the environment by GemvTuningFromEnv):
//   max_unroll: the most 16-byte packs per weight row a thread keeps in flight (2, 4 or 8; 8
//     applies at one or two rows of x only; the kernel takes what the shape needs up to this):
//     TANDEM_GEMV_UNROLL=2 or 8, default 4;
//   min_ctas: CTAs per SM the registers of the one-row kernels with two packs per weight row
//     (k <= 4096) must allow (5, 6 or 8; ptxas may spill to meet it), 0 for no cap, or -1 for the
//     measured choice (5, gemv.cu): TANDEM_GEMV_MIN_CTAS=0/5/6/8, default -1;
//   min_ctas_long: the same for the one-row plain kernels with four packs per weight row
//     (k <= 8192; the down projection): 4, 0 for no cap, or -1 for the choice of gemv.cu (4):
//     TANDEM_GEMV_MIN_CTAS_LONG=0/4, default -1.
struct GemvTuning {
  int max_unroll = 4;
  int min_ctas = -1;
  int min_ctas_long = -1;
};
GemvTuning GemvTuningFromEnv();

// m in [1, kGemvMaxRowsDevice].
cudaError_t LaunchGemvRaw(const void* x, const void* w, const void* bias, void* out, bool out_f32,
                          bool gated_silu, int m, int n, int k, const GemvFusion& fusion,
                          const GemvTuning& tuning, cudaStream_t stream);

// The fused QKV projection of model_kernels.h (LaunchQkvGemvRopeKvAppend): m in [1,
// kGemvMaxRowsDevice], k % 8 == 0, head_dim even; k_layer / v_layer the layer's cache; no
// residual epilogue.
cudaError_t LaunchGemvRopeKvRaw(const void* x, const void* w, const void* bias, void* qkv, int m,
                                int k, const int32_t* positions, const float* inv_freq,
                                const int32_t* slot_mapping, int num_heads, int num_kv_heads,
                                int head_dim, void* k_layer, void* v_layer,
                                const GemvFusion& fusion, const GemvTuning& tuning,
                                cudaStream_t stream);

}  // namespace tandem::cuda::internal
