#pragma once
// The CPU reference ModelRunner: float32 weights and a float32 paged KV cache in host memory,
// GEMMs through OpenBLAS, every other op from runtime/kernels/cpu_ops.h. It is the numerical
// reference of the whole system (checked against PyTorch in tests/reference/torch/).
//
// Ownership: the runner owns the weights (moved in), the KV cache and its scratch buffers. The KV
// cache is ONE allocation made at creation, [num_layers, 2 (K, V), num_blocks, block_size,
// num_kv_heads, head_dim] float32 (elem_bytes 4; kv_layout() gives the strides), zero-filled.
// Scratch grows to the largest batch seen and is then reused, so steady-state Forward calls
// allocate nothing but the output logits.
//
// Forward validates the whole batch before touching the cache: token ids outside the vocabulary,
// empty chunks, negative start positions, sample requests out of range (ValidateSampleRequest),
// positions past max_position_embeddings, block tables too short for their chunk, or block ids
// outside [0, num_blocks) are InvalidArgument and leave the KV cache and `out` unchanged. Chunks of
// one batch must belong to different sequences and must not write the same block slots (shared
// prefix blocks may be read by several chunks).
//
// Sampling: SupportsDeviceSampling() is true. When every logits row carries a SampleRequest,
// Forward runs tandem::SampleFromRequest on each row (a row with a NaN logit gets token 0 and a
// NaN logprob) and returns tokens and logprobs instead of logits, like a device runner, so the
// engine's runner-sampling path is exercised and checked on the CPU.
//
// Thread-safety: as ModelRunner, one thread at a time (the engine thread).

#include <cstddef>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/model/model_config.h"
#include "runtime/model/model_runner.h"
#include "runtime/model/weights.h"

namespace tandem {

struct CpuRunnerOptions {
  int block_size = 16;
  int num_blocks = 0;  // 0 = derive from kv_cache_bytes
  size_t kv_cache_bytes = 256 << 20;
  // Null: the MLP runs in the runner (local). Otherwise every layer's MLP runs on this backend
  // (runtime/mlp/mlp_backend.h), which must serve all layers of the model's shape; the weights
  // then need no gate/up/down_proj (any given are dropped), and a backend error fails Forward
  // with its code, naming the layer.
  std::shared_ptr<mlp::MlpBackend> mlp;
  // With an asynchronous backend (remote): the decode batch runs as up to this many
  // micro-batches of whole chunks in ping-pong, one's attention while another's MLP is away
  // (docs/mlp.md). 1: no ping-pong; 0: the count chosen per number of chunks from measured
  // layer-loop times (runtime/mlp/micro_batch_chooser.h).
  int mlp_micro_batches = 0;
};

// Creates the runner. InvalidArgument when the config is inconsistent (non-positive sizes,
// num_heads not a multiple of num_kv_heads, odd head_dim), when the weights' sizes do not match
// the config, or when the options leave fewer than one KV block; ResourceExhausted when the KV
// cache cannot be allocated.
absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(const ModelConfig& config,
                                                                  ModelWeights weights,
                                                                  const CpuRunnerOptions& options);

}  // namespace tandem
