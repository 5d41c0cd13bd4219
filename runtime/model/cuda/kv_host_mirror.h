#pragma once
// A pinned host mirror of a device KV cache, for KV transfer backends that move host memory
// (Debian's UCX has no CUDA transports): the CUDA runner's ModelRunner::transfer_layout() and
// StageKv (model_runner.h) forward here.
//
// The mirror is ONE cudaHostAlloc'd (portable) allocation of exactly the device cache's size
// (KvCacheLayout::bytes: every layer's K and V, so the runner's kv_cache_bytes bounds both), with
// the device layout's offsets and strides: block b of layer l, K or V, sits at the same offset in
// both. It is allocated on the first Layout() call (a runner that never serves transfers, such
// as `tandem generate`'s, pays nothing) and freed with the object.
//
// Copies (Stage): the block ids are sorted and deduplicated, grouped into runs of consecutive
// ids, and each run moves with one cudaMemcpy2DAsync over every (layer, K/V) slab (rows
// kv_stride apart) on the caller's stream, followed by one cudaStreamSynchronize.
//
// Thread-safety: Layout() may be called from any thread; Stage() from one thread at a time (the
// runner's engine thread), concurrently with Layout(). Failure: a failed allocation leaves
// nothing allocated (the next Layout() retries); a failed copy leaves the destination blocks
// unspecified and the source unchanged, and the stream in CUDA's error state if it is sticky.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "runtime/model/model_runner.h"

namespace tandem {

// One strided copy: `rows` rows of `width` bytes, row r at offset + r * pitch (on both sides).
struct MirrorCopy {
  size_t offset = 0;
  size_t width = 0;
  size_t pitch = 0;
  size_t rows = 0;
};

// The copies moving `blocks` (every layer, K and V) of `layout`, in ascending block order
// (duplicates once): one per run of consecutive block ids when layer_stride == 2 * kv_stride (the
// CUDA runner's layout), else one per (run, layer), or per (run, layer, K/V) when a run is wider
// than kv_stride. InvalidArgument for a block id outside [0, layout.num_blocks). Pure host logic.
absl::StatusOr<std::vector<MirrorCopy>> PlanMirrorCopies(const KvCacheLayout& layout,
                                                         std::span<const int32_t> blocks);

class KvHostMirror {
 public:
  KvHostMirror() = default;
  ~KvHostMirror();  // frees the pinned memory; no copy may be in flight
  KvHostMirror(const KvHostMirror&) = delete;
  KvHostMirror& operator=(const KvHostMirror&) = delete;

  // The mirror of `device` (a device KV cache on GPU `device_ordinal`): `device` with a host
  // base, allocating it on the first call (later calls must pass the same cache). ResourceExhausted
  // (or CUDA's error) when the pinned memory cannot be allocated.
  absl::StatusOr<KvCacheLayout> Layout(const KvCacheLayout& device, int device_ordinal);

  // Copies `blocks` (every layer, K and V) in direction `dir` on `stream` (of the cache's GPU) and
  // waits for them. FailedPrecondition before a successful Layout(); InvalidArgument for a bad
  // block id (nothing copied).
  absl::Status Stage(std::span<const int32_t> blocks, KvStage dir, cudaStream_t stream);

 private:
  absl::Mutex mu_;
  KvCacheLayout device_ ABSL_GUARDED_BY(mu_);
  int device_ordinal_ ABSL_GUARDED_BY(mu_) = 0;
  void* host_ ABSL_GUARDED_BY(mu_) = nullptr;  // set once
};

}  // namespace tandem
