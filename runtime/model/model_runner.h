#pragma once
// The scheduler -> runner contract: one forward pass over a batch that may mix prefill chunks and
// decode tokens of sequences of different lengths, against a paged KV cache the runner owns.
//
// KV layout (per layer, K and V separately): [num_blocks, block_size, num_kv_heads, head_dim].
// Block ids come from the block pool (runtime/kvcache); the runner never allocates blocks. The
// whole cache (every layer's K and V) is ONE contiguous allocation described by kv_layout(), so a
// transfer backend can register it once and address any block by offset.
//
// Thread-safety: a runner belongs to the engine thread; none of its methods may be called
// concurrently.
//
// KV transfer: transfer backends read and write HOST memory. A runner whose KV cache is host
// memory (the CPU runner, test fakes) lets them use the cache itself: transfer_layout() ==
// kv_layout() and StageKv does nothing. A runner with a device KV cache (the CUDA runner) gives
// them a host mirror instead (transfer_layout(): pinned host memory with the SAME offsets and
// strides as kv_layout(), so one block id names the same block in both) and copies blocks
// between the two on demand (StageKv): the engine stages a prompt's blocks device -> mirror on
// the prefill side after computing them and before handing them to the transfer, and mirror ->
// device on the decode side after the transfer wrote them and before decoding reads them.
//
// Layer-wise KV progress (device runners, for layer-wise KV streaming): after EnableKvProgress the
// runner advances a host-readable counter by one after each layer's KV append in every eager
// Forward (a CUDA-graph replay does not advance it), once that layer's KV of the step is complete
// in device memory. So the step's layer l is done once *counter >= kv_progress().next + l + 1,
// with `next` read before the Forward. Host runners have no counter: their KV is complete when
// Forward returns.
//
// Sampling on the runner: a runner whose SupportsDeviceSampling() is true samples the batch's
// rows itself when EVERY chunk with need_logits carries `sample` requests (one per logits row:
// num_logits of them, so a chunk scoring drafts has each row sampled with its own seed step):
// ForwardOutput then holds one token and logprob per row and no logits, so a step moves [rows]
// ints instead of [rows, vocab] floats off the device. The result must equal tandem::Sample(params,
// logits, {}, {}, seed, step) on the row's logits (runtime/sampling/sampler.h: SampleFromRequest),
// which the CPU and GPU samplers guarantee bit for bit. When any logits row lacks a request, or the
// runner does not support it, the runner ignores the requests and returns logits.
//
// Grammar masks (guided decoding): a sampled chunk of one logits row may carry `allowed`, the
// bits of the tokens it may draw (a chunk of several rows carries none); the result is then
// Sample(params, logits, {}, {}, seed, step, {}, allowed) (the logprob stays the raw log-softmax).
// The words may be written late: when ForwardBatch:: masks_ready is set the runner calls it exactly
// once per Forward that samples, after queuing the forward pass and before reading any `allowed`,
// so the host computes masks while the device runs. An error from it fails the Forward with that
// status.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/model_config.h"
#include "runtime/sampling/sample_request.h"

namespace tandem {

struct SequenceChunk {
  // New tokens of one sequence processed this step: positions [start_pos, start_pos + size).
  // KV of positions [0, start_pos) is already in the cache (earlier chunks or prefix cache).
  std::span<const int32_t> tokens;
  int start_pos = 0;
  // Block table covering positions [0, start_pos + tokens.size()): block_table[p / block_size].
  std::span<const int32_t> block_table;
  // When true, logits of the chunk's last token are produced (one row of ForwardOutput).
  bool need_logits = true;
  // With need_logits: the logits of the chunk's last `num_logits` tokens, one row each in token
  // order (1 <= num_logits <= tokens.size()): prompt logprobs, or scoring draft tokens.
  int num_logits = 1;
  // With need_logits: sample those rows on the runner (see the header comment), `num_logits`
  // requests in row order. Null: logits. Valid for the Forward call only.
  const SampleRequest* sample = nullptr;
  // With `sample` and num_logits 1: the tokens the row may draw, ceil(vocab / 64) words (bit
  // t % 64 of word t / 64); empty: all. Read only after ForwardBatch::masks_ready (see the header
  // comment).
  std::span<const uint64_t> allowed = {};
};

// Direction of StageKv.
enum class KvStage {
  kToMirror,    // device KV cache -> transfer mirror (prefill side, before sending)
  kFromMirror,  // transfer mirror -> device KV cache (decode side, after receiving)
};

struct KvProgress {
  const volatile uint64_t* counter = nullptr;  // host-readable from any thread; null: none
  uint64_t next = 0;  // the counter's value before the next Forward's first layer
};

struct ForwardBatch {
  std::vector<SequenceChunk> chunks;
  // Fills the chunks' `allowed` words (see the header comment); null when they are ready.
  std::function<absl::Status()> masks_ready = nullptr;
};

struct ForwardOutput {
  // [rows, vocab_size] float32: num_logits rows per chunk with need_logits, in chunk order; empty
  // when the runner sampled the rows.
  std::vector<float> logits;
  int rows = 0;
  // Filled (rows entries each) when the runner sampled the rows, else empty: the token and its
  // raw log-softmax logprob (NaN when the row's logits contain a NaN).
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
};

// Where the runner's KV cache lives, with the same offsets as proto tandem.v1.KvLayout: block b of
// layer l, K (kv = 0) or V (kv = 1), starts at
//   base + l * layer_stride + kv * kv_stride + b * block_stride
// and is block_bytes long ([block_size, num_kv_heads, head_dim] elements of elem_bytes each).
// [base, base + bytes) covers every block of every layer. Fixed for the runner's lifetime.
// `on_device`: base is device memory (the CUDA runner's cache, one cudaMalloc allocation on GPU
// `device_ordinal`), which only a backend that moves device memory (cuda_ipc) may register as it
// is; host-memory backends use transfer_layout() instead.
struct KvCacheLayout {
  void* base = nullptr;
  size_t bytes = 0;
  bool on_device = false;
  int device_ordinal = 0;
  int num_layers = 0;
  int num_blocks = 0;
  int block_size = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int elem_bytes = 0;
  size_t block_bytes = 0;
  size_t layer_stride = 0;
  size_t kv_stride = 0;
  size_t block_stride = 0;

  size_t Offset(int layer, int kv, int block) const {
    return static_cast<size_t>(layer) * layer_stride + static_cast<size_t>(kv) * kv_stride +
           static_cast<size_t>(block) * block_stride;
  }
  char* BlockPtr(int layer, int kv, int block) const {
    return static_cast<char*>(base) + Offset(layer, kv, block);
  }
};

class ModelRunner {
 public:
  virtual ~ModelRunner() = default;
  virtual const ModelConfig& config() const = 0;
  virtual int block_size() const = 0;  // tokens per KV block
  virtual int num_blocks() const = 0;  // KV blocks the runner allocated
  // The KV cache memory, for KV transfer. Callable from any thread (the layout is immutable);
  // the bytes themselves belong to the engine thread except for blocks the engine has handed out
  // for transfer (held after prefill, or reserved for a remote prefill).
  virtual KvCacheLayout kv_layout() const = 0;
  // Where transfer backends read and write this runner's KV: host memory with exactly
  // kv_layout()'s geometry (num_blocks, strides, block_bytes, bytes; only `base` may differ).
  // Callable from any thread (concurrently with the engine thread's calls). A device runner may
  // allocate its mirror on the first call (as many bytes as the KV cache, pinned): an error then
  // (ResourceExhausted, Internal) leaves nothing allocated and a later call tries again; after a
  // success the layout is fixed for the runner's lifetime. The mirror's bytes of a block belong
  // to whoever owns the block (the engine thread, or a transfer while the engine has handed the
  // block out). Default: the KV cache itself (a host runner).
  virtual absl::StatusOr<KvCacheLayout> transfer_layout() { return kv_layout(); }
  // Copies `blocks` (every layer, K and V) between the KV cache and transfer_layout(), in
  // direction `dir`, and returns when the copy is complete (synchronous on the runner's stream).
  // Engine thread only (like Forward); the caller owns the blocks (no forward pass and no
  // transfer touches them meanwhile). Block ids outside [0, num_blocks()) are InvalidArgument and
  // nothing is copied. On any other error (a device copy failed) the destination blocks are
  // unspecified and the source blocks unchanged: the caller must not use the destination copy
  // (the prefill side reports the prompt failed; the decode side recomputes it). Default (host
  // runners, transfer_layout() == kv_layout()): OK, no work.
  virtual absl::Status StageKv(std::span<const int32_t> blocks, KvStage dir) {
    return absl::OkStatus();
  }
  // Starts layer progress (see the header comment). Engine thread only. Unimplemented for runners
  // without a device (their KV is complete when Forward returns).
  virtual absl::Status EnableKvProgress() {
    return absl::UnimplementedError("this runner has no layer progress");
  }
  // Engine thread only. counter null until EnableKvProgress succeeded.
  virtual KvProgress kv_progress() const { return {}; }
  // Whether Forward samples rows that carry a SampleRequest (see the header comment). Fixed for
  // the runner's lifetime.
  virtual bool SupportsDeviceSampling() const { return false; }
  // The counters of the runner's MLP backend (runtime/mlp/mlp_backend.h); zero when the MLP is
  // local. Engine thread only.
  virtual mlp::MlpBackendStats mlp_stats() const { return {}; }
  // Runs the batch. Writes the chunks' K/V into their blocks and fills `out` (every field: logits
  // or tokens/logprobs, the other cleared). On error the KV of the chunks' new positions is
  // unspecified (the caller recomputes or drops those sequences).
  virtual absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) = 0;
};

}  // namespace tandem
