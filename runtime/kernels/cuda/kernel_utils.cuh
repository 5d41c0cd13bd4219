#pragma once
// Private device helpers shared by the model kernels' .cu files: bf16 packs, 16-byte loads,
// warp reductions. Included only by .cu files of tandem_kernels_cuda.

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

namespace tandem::cuda::internal {

constexpr int kWarpSize = 32;

// Eight bf16 in one 16-byte access.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ Bf16x8 LoadBf16x8(const void* p) {
  const uint4 raw = *static_cast<const uint4*>(p);
  Bf16x8 out;
  memcpy(&out, &raw, sizeof(out));
  return out;
}

__device__ __forceinline__ void StoreBf16x8(void* p, const Bf16x8& v) {
  uint4 raw;
  memcpy(&raw, &v, sizeof(raw));
  *static_cast<uint4*>(p) = raw;
}

__device__ __forceinline__ void Bf16x8ToFloat(const Bf16x8& v, float (&f)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 t = __bfloat1622float2(v.h[i]);
    f[2 * i] = t.x;
    f[2 * i + 1] = t.y;
  }
}

__device__ __forceinline__ Bf16x8 FloatToBf16x8(const float (&f)[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  }
  return v;
}

// RoPE, neox style (HF rotate_half), in the one arithmetic every rotating kernel uses, so the fused
// paths (QKV projection epilogues) are bit-identical to the RoPE kernels. As cpu::RopeTables: the
// angle pos * inv_freq rounded to float32, then sincosf (accurate to a couple of float32 ulps over
// the whole range; no fast-math intrinsics).
__device__ __forceinline__ void RopeCosSin(float pos, float inv_freq, float& c, float& s) {
  sincosf(__fmul_rn(pos, inv_freq), &s, &c);
}

// The pair (x0 at i, x1 at i + head_dim / 2) rotated by (c, s), each product rounded on its own.
__device__ __forceinline__ void RopeRotate(float x0, float x1, float c, float s, float& y0,
                                           float& y1) {
  y0 = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
  y1 = __fadd_rn(__fmul_rn(x1, c), __fmul_rn(x0, s));
}

// A bf16 pair rotated in place at position `pos`.
__device__ __forceinline__ void RopeRotateBf16(__nv_bfloat16& z0, __nv_bfloat16& z1, float pos,
                                               float inv_freq) {
  float c, s, y0, y1;
  RopeCosSin(pos, inv_freq, c, s);
  RopeRotate(__bfloat162float(z0), __bfloat162float(z1), c, s, y0, y1);
  z0 = __float2bfloat16_rn(y0);
  z1 = __float2bfloat16_rn(y1);
}

// cp.async (sm_80+): a 16-byte global -> shared copy that bypasses L1 and registers; with
// valid == false the 16 shared bytes are zero-filled and nothing is read. Completion is tracked
// per thread in commit groups; other threads see the bytes after a barrier.
__device__ __forceinline__ void CpAsyncCg16(void* smem, const void* gmem, bool valid) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(gmem),
               "r"(src_bytes)
               : "memory");
}

// The same copy with an L2 cache policy (L2EvictFirstPolicy()).
__device__ __forceinline__ void CpAsyncCg16(void* smem, const void* gmem, bool valid,
                                            uint64_t policy) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  const int src_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst),
               "l"(gmem), "r"(src_bytes), "l"(policy)
               : "memory");
}

// The L2 cache policy (sm_80+) for loads of data read once: evict_first lines are replaced before
// any normal line, so a stream through L2 leaves what else is cached there in place.
__device__ __forceinline__ uint64_t L2EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ void CpAsyncCommitGroup() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
__device__ __forceinline__ void CpAsyncWaitGroup() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// Programmatic dependent launch (sm_90). A kernel launched with LaunchKernel (below) may start
// while the previous kernel in the stream is still running; it must call PdlWait() before it
// reads anything an earlier kernel wrote or writes anything an earlier kernel may still read, and
// before any early return (a CTA that exits without waiting would let the kernels after it start
// before this one's predecessors finished). PdlLaunchDependents() lets the next kernel's CTAs be
// scheduled once every CTA of this one has called it (or exited); it publishes nothing, since the
// dependents' PdlWait() still waits for this whole grid to finish and flush. Without the launch
// attribute (or before sm_90) both are no-ops.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void PdlLaunchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches `kernel` on `stream` with programmatic stream serialization. Every kernel launched
// this way must follow the PdlWait() rule above. Capturable in a CUDA graph.
template <typename... KernelArgs, typename... Args>
cudaError_t LaunchKernel(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem_bytes,
                         cudaStream_t stream, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<KernelArgs>(args)...);
}

// Raises `kernel`'s dynamic shared-memory limit to `bytes` (needed above 48 KiB) on the current
// device, once per device: `configured` (one static per kernel instantiation) has bit d set once
// device d is done; devices >= 64 set it on every call. A plain attribute call (no allocation or
// synchronization), so launchers that use it stay capturable in a CUDA graph.
template <typename Kernel>
cudaError_t OptInDynamicSharedMemory(Kernel kernel, size_t bytes,
                                     std::atomic<uint64_t>& configured) {
  int device = 0;
  if (const cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const uint64_t bit = device < 64 ? uint64_t{1} << device : 0;
  if (bit != 0 && (configured.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes));
  if (e == cudaSuccess) configured.fetch_or(bit, std::memory_order_release);
  return e;
}

// Whether the current device has compute capability 9.0, where the sm_90a (wgmma) kernels run
// (their code runs on no other device); cached per device.
inline bool CurrentDeviceIsSm90() {
  static std::atomic<uint64_t> known{0}, hopper{0};  // bit d: device d checked / is 9.0
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device >= 64) return false;
  const uint64_t bit = uint64_t{1} << device;
  if ((known.load(std::memory_order_acquire) & bit) == 0) {
    int major = 0, minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    if (major == 9 && minor == 0) hopper.fetch_or(bit, std::memory_order_relaxed);
    known.fetch_or(bit, std::memory_order_release);
  }
  return (hopper.load(std::memory_order_relaxed) & bit) != 0;
}

inline bool IsAligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

inline unsigned CeilDiv(long long a, long long b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace tandem::cuda::internal
