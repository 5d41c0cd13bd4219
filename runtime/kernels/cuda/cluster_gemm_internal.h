#pragma once
// Private to tandem_kernels_cuda: the raw launcher of cluster_gemm_sm90.cu (sm_90a code), which
// cluster_gemm_kernels.cc wraps with argument checks and the plan (cluster_gemm.h). nvcc does not
// include cluster_gemm.h (it pulls absl), hence the plain mirror of its constants.

#include <cuda_runtime_api.h>

namespace tandem::cuda::internal {

constexpr int kClusterGemmMaxRowsDevice = 64;
constexpr int kClusterGemmKStepDevice = 64;
constexpr int kClusterGemmSubRows = 64;   // weight rows of one wgmma (m64n64k16) sub-tile
constexpr int kClusterGemmMaxSubs = 4;    // sub-tiles per CTA: tiles of 64-256 weight rows
constexpr int kClusterGemmMaxSplits = 8;  // the portable cluster size
constexpr int kClusterGemmTraceWords = 8;

struct ClusterGemmRaw {
  const void* x;     // bf16 [m, k]
  const void* w;     // bf16 [n, k]
  const void* bias;  // bf16 [n] or null
  void* out;         // [m, n], bf16 or float32
  bool out_f32;
  int m, n, k;
  int subs;     // weight rows per CTA / 64 (1-4)
  int tiles;    // ceil(n / (64 subs))
  int splits;   // CTAs per cluster, each one K range (1, 2, 4 or 8)
  int k_steps;  // 64-wide k steps per split: k / 64 / splits
  int x_rows;   // activation rows per stage box: m rounded up to 8 (filled by the launcher)
  int stages;   // ring depth: 0 for as many as fit, else 2 to that (fewer leave shared memory
                // for the neighbouring kernels' CTAs)
  // Diagnostics (null: off): kClusterGemmTraceWords words per CTA (block y * tiles + x): the
  // %globaltimer (ns) at entry, after the programmatic wait, at the first full stage, at the end
  // of the main loop, after the first cluster (or CTA) barrier and at exit; then the SM id and
  // k_steps.
  unsigned long long* trace;
};

// Queues the kernel: grid (tiles, splits), clusters of (1, splits). Returns the launch error.
cudaError_t LaunchClusterGemmRaw(const ClusterGemmRaw& p, cudaStream_t stream);

// Whether the current device has compute capability 9.0 (where the sm_90a kernel runs).
bool ClusterGemmDeviceRuns();

// Clusters of `splits` CTAs (1, 2, 4 or 8) of the kernel (one CTA per SM) the current device holds
// at once; 0 when the kernel cannot run there. Cached per device and cluster size.
int ClusterGemmMaxActiveClusters(int splits);

}  // namespace tandem::cuda::internal
