#include "runtime/model/cpu_model_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/micro_batch_chooser.h"
#include "runtime/sampling/sampler.h"

namespace tandem {
namespace {

absl::Status CheckSize(const std::vector<float>& v, size_t expected, const std::string& name,
                       bool optional = false) {
  if (optional && v.empty()) return absl::OkStatus();
  if (v.size() != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CPU runner: weight %s has %d floats, config expects %d", name, v.size(), expected));
  }
  return absl::OkStatus();
}

absl::Status ValidateConfig(const ModelConfig& c) {
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 ||
      c.max_position_embeddings <= 0) {
    return absl::InvalidArgumentError("CPU runner: model config has a non-positive size");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CPU runner: num_heads %d is not a multiple of num_kv_heads %d",
                        c.num_heads, c.num_kv_heads));
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CPU runner: head_dim %d is odd (RoPE needs pairs)", c.head_dim));
  }
  return absl::OkStatus();
}

absl::Status ValidateWeights(const ModelConfig& c, const ModelWeights& w, bool offloaded_mlp) {
  const size_t hidden = c.hidden_size, inter = c.intermediate_size;
  const size_t q_out = static_cast<size_t>(c.num_heads) * c.head_dim;
  const size_t kv_out = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  RETURN_IF_ERROR(CheckSize(w.embed, c.vocab_size * hidden, "embed"));
  RETURN_IF_ERROR(CheckSize(w.final_norm, hidden, "final_norm"));
  RETURN_IF_ERROR(CheckSize(w.lm_head, c.vocab_size * hidden, "lm_head", /*optional=*/true));
  if (w.layers.size() != static_cast<size_t>(c.num_layers)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CPU runner: %d layers of weights, config has %d", w.layers.size(), c.num_layers));
  }
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = absl::StrFormat("layers.%d.", i);
    RETURN_IF_ERROR(CheckSize(l.input_norm, hidden, p + "input_norm"));
    RETURN_IF_ERROR(CheckSize(l.post_norm, hidden, p + "post_norm"));
    RETURN_IF_ERROR(CheckSize(l.q_proj, q_out * hidden, p + "q_proj"));
    RETURN_IF_ERROR(CheckSize(l.k_proj, kv_out * hidden, p + "k_proj"));
    RETURN_IF_ERROR(CheckSize(l.v_proj, kv_out * hidden, p + "v_proj"));
    RETURN_IF_ERROR(CheckSize(l.q_bias, q_out, p + "q_bias", !c.attention_bias));
    RETURN_IF_ERROR(CheckSize(l.k_bias, kv_out, p + "k_bias", !c.attention_bias));
    RETURN_IF_ERROR(CheckSize(l.v_bias, kv_out, p + "v_bias", !c.attention_bias));
    RETURN_IF_ERROR(CheckSize(l.o_proj, hidden * q_out, p + "o_proj"));
    // With the MLP on a backend the runner holds none of it (any given is dropped).
    RETURN_IF_ERROR(CheckSize(l.gate_proj, inter * hidden, p + "gate_proj", offloaded_mlp));
    RETURN_IF_ERROR(CheckSize(l.up_proj, inter * hidden, p + "up_proj", offloaded_mlp));
    RETURN_IF_ERROR(CheckSize(l.down_proj, hidden * inter, p + "down_proj", offloaded_mlp));
  }
  return absl::OkStatus();
}

const float* OrNull(const std::vector<float>& v) { return v.empty() ? nullptr : v.data(); }

class CpuModelRunner final : public ModelRunner {
 public:
  CpuModelRunner(const ModelConfig& config, ModelWeights weights, int block_size, int num_blocks,
                 std::shared_ptr<mlp::MlpBackend> mlp, int micro_batches)
      : config_(config),
        weights_(std::move(weights)),
        mlp_(std::move(mlp)),
        micro_batches_(micro_batches),
        mlp_shape_{.first_layer = 0,
                   .end_layer = config.num_layers,
                   .hidden_size = config.hidden_size,
                   .intermediate_size = config.intermediate_size},
        block_size_(block_size),
        num_blocks_(num_blocks),
        kv_shape_{.block_size = block_size,
                  .num_kv_heads = config.num_kv_heads,
                  .head_dim = config.head_dim},
        inv_freq_(config.head_dim / 2) {
    if (config_.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
      cpu::Llama3RopeScaling s;
      s.factor = config_.rope_scaling.factor;
      s.low_freq_factor = config_.rope_scaling.low_freq_factor;
      s.high_freq_factor = config_.rope_scaling.high_freq_factor;
      s.original_max_position_embeddings = config_.rope_scaling.original_max_position_embeddings;
      cpu::RopeInvFreq(config_.head_dim, config_.rope_theta, &s, inv_freq_.data());
    } else {
      cpu::RopeInvFreq(config_.head_dim, config_.rope_theta, nullptr, inv_freq_.data());
    }
  }

  // Fuses the projections (one GEMM for q/k/v, one for gate/up) and allocates the KV cache;
  // false when memory is short.
  bool Init() {
    const size_t per_layer = static_cast<size_t>(num_blocks_) * kv_shape_.BlockStride();
    try {
      fused_.resize(config_.num_layers);
      for (int l = 0; l < config_.num_layers; ++l) {
        LayerWeights& lw = weights_.layers[l];
        FusedLayer& f = fused_[l];
        // Row-major [out, in] matrices stack along `out` by concatenation.
        f.qkv = Concat(lw.q_proj, lw.k_proj, lw.v_proj);
        if (!lw.q_bias.empty()) f.qkv_bias = Concat(lw.q_bias, lw.k_bias, lw.v_bias);
        if (mlp_ == nullptr) {
          f.mlp.gate_up = Concat(lw.gate_proj, lw.up_proj, {});
          f.mlp.down = std::move(lw.down_proj);
        }
        for (std::vector<float>* v : {&lw.q_proj, &lw.k_proj, &lw.v_proj, &lw.q_bias, &lw.k_bias,
                                      &lw.v_bias, &lw.gate_proj, &lw.up_proj, &lw.down_proj}) {
          std::vector<float>().swap(*v);
        }
      }
      kv_cache_.assign(2 * per_layer * static_cast<size_t>(config_.num_layers), 0.0f);
    } catch (const std::bad_alloc&) {
      return false;
    }
    return true;
  }

  static std::vector<float> Concat(const std::vector<float>& a, const std::vector<float>& b,
                                   const std::vector<float>& c) {
    std::vector<float> out;
    out.reserve(a.size() + b.size() + c.size());
    out.insert(out.end(), a.begin(), a.end());
    out.insert(out.end(), b.begin(), b.end());
    out.insert(out.end(), c.begin(), c.end());
    return out;
  }

  const ModelConfig& config() const override { return config_; }
  int block_size() const override { return block_size_; }
  int num_blocks() const override { return num_blocks_; }
  KvCacheLayout kv_layout() const override {
    KvCacheLayout l;
    l.base = const_cast<float*>(kv_cache_.data());
    l.bytes = kv_cache_.size() * sizeof(float);
    l.num_layers = config_.num_layers;
    l.num_blocks = num_blocks_;
    l.block_size = block_size_;
    l.num_kv_heads = config_.num_kv_heads;
    l.head_dim = config_.head_dim;
    l.elem_bytes = sizeof(float);
    l.block_bytes = kv_shape_.BlockStride() * sizeof(float);
    l.block_stride = l.block_bytes;
    l.kv_stride = l.block_stride * static_cast<size_t>(num_blocks_);
    l.layer_stride = 2 * l.kv_stride;
    return l;
  }

  mlp::MlpBackendStats mlp_stats() const override {
    return mlp_ != nullptr ? mlp_->stats() : mlp::MlpBackendStats{};
  }

  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    RETURN_IF_ERROR(Validate(batch));
    out->tokens.clear();
    out->logprobs.clear();
    if (batch.chunks.empty()) {
      out->logits.clear();
      out->rows = 0;
      return absl::OkStatus();
    }
    const ModelConfig& c = config_;
    const int hidden = c.hidden_size;

    int total = 0, max_context = 0, logit_rows = 0;
    for (const SequenceChunk& ch : batch.chunks) {
      total += static_cast<int>(ch.tokens.size());
      max_context = std::max(max_context, ch.start_pos + static_cast<int>(ch.tokens.size()));
      logit_rows += ch.need_logits ? ch.num_logits : 0;
    }
    try {
      Reserve(total, max_context);
    } catch (const std::bad_alloc&) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("CPU runner: no memory for the scratch of a %d-token batch", total));
    }

    // Embeddings and positions of every token of the batch, chunk after chunk.
    int row = 0;
    for (const SequenceChunk& ch : batch.chunks) {
      const int n = static_cast<int>(ch.tokens.size());
      cpu::EmbeddingGather(weights_.embed.data(), hidden, ch.tokens.data(), n,
                           x_.data() + static_cast<size_t>(row) * hidden);
      for (int i = 0; i < n; ++i) positions_[row + i] = ch.start_pos + i;
      row += n;
    }

    if (mlp_ == nullptr) {
      const MicroBatch all{0, static_cast<int>(batch.chunks.size()), 0, total};
      for (int li = 0; li < c.num_layers; ++li) {
        Attention(batch, li, all);
        mlp::DenseMlpForward(fused_[li].mlp, mlp_shape_, h_.data(), total, h_.data(),
                             &mlp_scratch_);
        cpu::AddInPlace(x_.data(), h_.data(), static_cast<size_t>(total) * hidden);
      }
    } else {
      RETURN_IF_ERROR(LayersOnBackend(batch, total));
    }

    // Final norm and LM head for the last num_logits tokens of each chunk that wants logits.
    row = 0;
    int r = 0;
    for (const SequenceChunk& ch : batch.chunks) {
      row += static_cast<int>(ch.tokens.size());
      if (!ch.need_logits) continue;
      for (int k = ch.num_logits; k >= 1; --k) {
        cpu::RmsNorm(x_.data() + static_cast<size_t>(row - k) * hidden, weights_.final_norm.data(),
                     1, hidden, c.rms_norm_eps, last_.data() + static_cast<size_t>(r) * hidden);
        ++r;
      }
    }
    out->rows = logit_rows;
    out->logits.resize(static_cast<size_t>(logit_rows) * c.vocab_size);
    if (logit_rows > 0) {
      cpu::Linear(last_.data(), weights_.LmHead().data(), nullptr, logit_rows, hidden, c.vocab_size,
                  out->logits.data());
    }
    if (logit_rows > 0 &&
        std::all_of(batch.chunks.begin(), batch.chunks.end(), [](const SequenceChunk& ch) {
          return !ch.need_logits || (ch.sample != nullptr && ch.num_logits == 1);
        })) {
      if (batch.masks_ready) RETURN_IF_ERROR(batch.masks_ready());
      SampleRows(batch, out);
    }
    return absl::OkStatus();
  }

  bool SupportsDeviceSampling() const override { return true; }

 private:
  // Replaces out->logits by the sampled tokens and logprobs (model_runner.h): the CPU sampler on
  // each row, which is what the engine would run on the same logits.
  void SampleRows(const ForwardBatch& batch, ForwardOutput* out) const {
    const size_t vocab = config_.vocab_size;
    out->tokens.resize(out->rows);
    out->logprobs.resize(out->rows);
    int r = 0;
    for (const SequenceChunk& ch : batch.chunks) {
      if (!ch.need_logits) continue;
      const std::span<const float> row(out->logits.data() + r * vocab, vocab);
      if (std::any_of(row.begin(), row.end(), [](float x) { return std::isnan(x); })) {
        out->tokens[r] = 0;
        out->logprobs[r] = std::numeric_limits<float>::quiet_NaN();
      } else {
        const SampleResult s = SampleFromRequest(*ch.sample, row, ch.allowed);
        out->tokens[r] = s.token;
        out->logprobs[r] = s.logprob;
      }
      ++r;
    }
    out->logits.clear();
  }

  absl::Status Validate(const ForwardBatch& batch) const {
    for (size_t i = 0; i < batch.chunks.size(); ++i) {
      const SequenceChunk& ch = batch.chunks[i];
      const int64_t n = static_cast<int64_t>(ch.tokens.size());
      if (n == 0) {
        return absl::InvalidArgumentError(absl::StrFormat("chunk %d has no tokens", i));
      }
      if (ch.start_pos < 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chunk %d: negative start_pos %d", i, ch.start_pos));
      }
      if (ch.need_logits && (ch.num_logits < 1 || ch.num_logits > n)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chunk %d: num_logits %d is not in [1, %d]", i, ch.num_logits, n));
      }
      if (ch.need_logits && ch.sample != nullptr) {
        if (absl::Status s = ValidateSampleRequest(*ch.sample); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrFormat("chunk %d: %s", i, s.message()));
        }
      }
      const int64_t end = ch.start_pos + n;
      if (end > config_.max_position_embeddings) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chunk %d: positions up to %d exceed max_position_embeddings %d", i,
                            end, config_.max_position_embeddings));
      }
      for (int64_t t = 0; t < n; ++t) {
        if (ch.tokens[t] < 0 || ch.tokens[t] >= config_.vocab_size) {
          return absl::InvalidArgumentError(
              absl::StrFormat("chunk %d: token id %d outside vocabulary [0, %d)", i, ch.tokens[t],
                              config_.vocab_size));
        }
      }
      const int64_t blocks_needed = (end + block_size_ - 1) / block_size_;
      if (static_cast<int64_t>(ch.block_table.size()) < blocks_needed) {
        return absl::InvalidArgumentError(
            absl::StrFormat("chunk %d: block table has %d blocks, positions up to %d need %d", i,
                            ch.block_table.size(), end, blocks_needed));
      }
      for (int64_t b = 0; b < blocks_needed; ++b) {
        if (ch.block_table[b] < 0 || ch.block_table[b] >= num_blocks_) {
          return absl::InvalidArgumentError(absl::StrFormat("chunk %d: block id %d outside [0, %d)",
                                                            i, ch.block_table[b], num_blocks_));
        }
      }
    }
    return absl::OkStatus();
  }

  // A contiguous range of a batch's chunks and their rows.
  struct MicroBatch {
    int chunk_begin, chunk_end;
    int row_begin, row_end;
    int rows() const { return row_end - row_begin; }
  };

  // Layer `li` up to the MLP for the rows of `m`: input norm, q/k/v, RoPE, KV append, attention,
  // o_proj and its residual, then the post-attention norm into h_ (the MLP's input).
  void Attention(const ForwardBatch& batch, int li, const MicroBatch& m) {
    const ModelConfig& c = config_;
    const int hidden = c.hidden_size;
    const int q_width = c.num_heads * c.head_dim;
    const int kv_width = c.num_kv_heads * c.head_dim;
    const int qkv_width = q_width + 2 * kv_width;
    const LayerWeights& lw = weights_.layers[li];
    const FusedLayer& fl = fused_[li];
    const size_t r0 = static_cast<size_t>(m.row_begin);
    const int rows = m.rows();
    float* x = x_.data() + r0 * hidden;
    float* h = h_.data() + r0 * hidden;
    cpu::RmsNorm(x, lw.input_norm.data(), rows, hidden, c.rms_norm_eps, h);
    // qkv_ rows: [q (q_width) | k (kv_width) | v (kv_width)].
    float* q = qkv_.data() + r0 * qkv_width;
    cpu::Linear(h, fl.qkv.data(), OrNull(fl.qkv_bias), rows, hidden, qkv_width, q);
    float* k = q + q_width;
    float* v = k + kv_width;
    cpu::ApplyRope(q, rows, qkv_width, c.num_heads, c.head_dim, positions_.data() + r0,
                   rope_cos_.data(), rope_sin_.data());
    cpu::ApplyRope(k, rows, qkv_width, c.num_kv_heads, c.head_dim, positions_.data() + r0,
                   rope_cos_.data(), rope_sin_.data());
    // Every chunk's new K/V first, then attention: chunks are distinct sequences, so one
    // chunk's attention reads only its own new rows plus cached (possibly shared) prefix.
    int row = 0;
    for (int i = m.chunk_begin; i < m.chunk_end; ++i) {
      const SequenceChunk& ch = batch.chunks[i];
      const int n = static_cast<int>(ch.tokens.size());
      cpu::PagedKvAppend(k + static_cast<size_t>(row) * qkv_width, qkv_width,
                         v + static_cast<size_t>(row) * qkv_width, qkv_width, n, ch.start_pos,
                         ch.block_table.data(), kv_shape_, KCache(li), VCache(li));
      row += n;
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    float* attn = attn_.data() + r0 * q_width;
    row = 0;
    for (int i = m.chunk_begin; i < m.chunk_end; ++i) {
      const SequenceChunk& ch = batch.chunks[i];
      const int n = static_cast<int>(ch.tokens.size());
      cpu::PagedAttention(q + static_cast<size_t>(row) * qkv_width, qkv_width, n, ch.start_pos,
                          c.num_heads, ch.block_table.data(), kv_shape_, KCache(li), VCache(li),
                          scale, scores_.data(), attn + static_cast<size_t>(row) * q_width);
      row += n;
    }
    cpu::Linear(attn, lw.o_proj.data(), nullptr, rows, q_width, hidden, h);
    cpu::AddInPlace(x, h, static_cast<size_t>(rows) * hidden);
    cpu::RmsNorm(x, lw.post_norm.data(), rows, hidden, c.rms_norm_eps, h);
  }

  // The batch split into at most `n` micro-batches of whole chunks, about equal in rows.
  static std::vector<MicroBatch> SplitMicroBatches(const ForwardBatch& batch, int total, int n) {
    std::vector<MicroBatch> out;
    const int chunks = static_cast<int>(batch.chunks.size());
    n = std::max(1, std::min(n, chunks));
    int chunk = 0, row = 0;
    for (int m = 0; m < n; ++m) {
      MicroBatch mb{chunk, chunk, row, row};
      const int target = static_cast<int>(static_cast<int64_t>(total) * (m + 1) / n);
      // Every micro-batch gets at least one chunk, and leaves one for each after it.
      while (mb.chunk_end < chunks - (n - 1 - m) &&
             (mb.chunk_end == mb.chunk_begin || mb.row_end < target)) {
        mb.row_end += static_cast<int>(batch.chunks[mb.chunk_end].tokens.size());
        ++mb.chunk_end;
      }
      if (m == n - 1) {
        while (mb.chunk_end < chunks) {
          mb.row_end += static_cast<int>(batch.chunks[mb.chunk_end].tokens.size());
          ++mb.chunk_end;
        }
      }
      chunk = mb.chunk_end;
      row = mb.row_end;
      out.push_back(mb);
    }
    return out;
  }

  // Every layer with its MLP on mlp_. With an asynchronous backend the batch runs as
  // micro-batches in ping-pong: one micro-batch's attention while another's MLP is away. Each
  // submitted MLP is waited once, also after a failure.
  absl::Status LayersOnBackend(const ForwardBatch& batch, int total) {
    const int hidden = config_.hidden_size;
    const auto start = std::chrono::steady_clock::now();
    const int chunks = static_cast<int>(batch.chunks.size());
    // 0: the count is chosen from measured times (micro_batch_chooser.h), per number of chunks.
    const bool choose = micro_batches_ == 0 && mlp_->asynchronous();
    const int count =
        !mlp_->asynchronous() ? 1 : (choose ? chooser_.Choose(chunks) : micro_batches_);
    const std::vector<MicroBatch> mbs = SplitMicroBatches(batch, total, count);
    std::vector<std::optional<mlp::MlpBackend::Handle>> pending(mbs.size());
    absl::Status status;
    const auto finish = [&](size_t m, int layer) {
      absl::Status s = mlp_->Wait(*pending[m]);
      pending[m].reset();
      if (!s.ok()) {
        if (status.ok()) {
          status =
              absl::Status(s.code(), absl::StrFormat("layer %d MLP on the %s backend: %s", layer,
                                                     std::string(mlp_->name()), s.message()));
        }
        return;
      }
      const size_t r0 = static_cast<size_t>(mbs[m].row_begin) * hidden;
      cpu::AddInPlace(x_.data() + r0, last_.data() + r0,
                      static_cast<size_t>(mbs[m].rows()) * hidden);
    };
    for (int li = 0; li < config_.num_layers && status.ok(); ++li) {
      for (size_t m = 0; m < mbs.size() && status.ok(); ++m) {
        if (pending[m].has_value()) finish(m, li - 1);
        if (!status.ok()) break;
        Attention(batch, li, mbs[m]);
        const size_t r0 = static_cast<size_t>(mbs[m].row_begin) * hidden;
        absl::StatusOr<mlp::MlpBackend::Handle> h = mlp_->Submit(
            li, h_.data() + r0, mbs[m].rows(), last_.data() + r0, absl::InfiniteFuture());
        if (!h.ok()) {
          status = absl::Status(h.status().code(),
                                absl::StrFormat("layer %d MLP on the %s backend: %s", li,
                                                std::string(mlp_->name()), h.status().message()));
          break;
        }
        pending[m] = *h;
      }
    }
    for (size_t m = 0; m < mbs.size(); ++m) {
      if (pending[m].has_value()) finish(m, config_.num_layers - 1);
    }
    if (choose && status.ok()) {
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (std::optional<int> decided = chooser_.Record(chunks, static_cast<int>(mbs.size()), ms)) {
        const int bucket = mlp::MicroBatchChooser::BucketOf(chunks);
        LOG(INFO) << "CPU runner: steps of " << bucket / 2 + 1 << "-" << bucket
                  << " chunks run the " << mlp_->name() << " MLP in " << *decided
                  << " micro-batch(es) (measured fastest)";
      }
    }
    // On failure the batch's KV of the layers computed is written; the engine fails its
    // requests.
    return status;
  }

  // Grows scratch buffers (never shrinks) to `tokens` rows and RoPE tables to `max_context`
  // positions; a no-op once the largest batch has been seen. Throws std::bad_alloc (caught by
  // Forward) with the capacities unchanged.
  void Reserve(int tokens, int max_context) {
    const ModelConfig& c = config_;
    if (tokens > capacity_tokens_) {
      const size_t t = static_cast<size_t>(tokens);
      x_.resize(t * c.hidden_size);
      h_.resize(t * c.hidden_size);
      last_.resize(t * c.hidden_size);
      qkv_.resize(t * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
      attn_.resize(t * c.num_heads * c.head_dim);
      positions_.resize(t);
      capacity_tokens_ = tokens;
    }
    if (max_context > rope_positions_) {
      // Doubling keeps the table growth amortized; capped by the model's position limit.
      const int positions =
          std::min(c.max_position_embeddings, std::max(max_context, 2 * rope_positions_));
      const size_t half = c.head_dim / 2;
      rope_cos_.resize(positions * half);
      rope_sin_.resize(positions * half);
      cpu::RopeTables(inv_freq_.data(), c.head_dim, positions, rope_cos_.data(), rope_sin_.data());
      scores_.resize(positions);
      rope_positions_ = positions;
    }
  }

  float* KCache(int layer) { return kv_cache_.data() + LayerFloats() * layer; }
  float* VCache(int layer) { return KCache(layer) + LayerFloats() / 2; }
  size_t LayerFloats() const {
    return 2 * static_cast<size_t>(num_blocks_) * kv_shape_.BlockStride();
  }

  const ModelConfig config_;
  // Norms, o_proj, embeddings and LM head; the q/k/v and MLP matrices are moved into fused_ by
  // Init().
  ModelWeights weights_;
  // Null: the MLP runs here, from fused_[l].mlp; else on this backend and fused_ holds none.
  const std::shared_ptr<mlp::MlpBackend> mlp_;
  const int micro_batches_;  // with an asynchronous mlp_ (0: chosen by chooser_)
  mlp::MicroBatchChooser chooser_;
  const mlp::MlpShape mlp_shape_;
  struct FusedLayer {
    std::vector<float> qkv;       // [(heads + 2 * kv_heads) * head_dim, hidden]
    std::vector<float> qkv_bias;  // [(heads + 2 * kv_heads) * head_dim] or empty
    mlp::DenseMlpLayer mlp;       // empty with an MLP backend
  };
  std::vector<FusedLayer> fused_;
  const int block_size_;
  const int num_blocks_;
  const cpu::PagedKvShape kv_shape_;
  std::vector<float> inv_freq_;  // [head_dim / 2]
  // The whole KV cache in one allocation: [num_layers, 2 (K, V), num_blocks, block_size,
  // num_kv_heads, head_dim] floats (see kv_layout()).
  std::vector<float> kv_cache_;

  // Scratch, sized for capacity_tokens_ rows / rope_positions_ positions.
  int capacity_tokens_ = 0;
  int rope_positions_ = 0;
  std::vector<float> x_, h_, last_, qkv_, attn_, mlp_scratch_;
  std::vector<int32_t> positions_;
  std::vector<float> rope_cos_, rope_sin_;  // [rope_positions_, head_dim / 2]
  std::vector<float> scores_;               // [rope_positions_]
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelRunner>> CreateCpuModelRunner(const ModelConfig& config,
                                                                  ModelWeights weights,
                                                                  const CpuRunnerOptions& options) {
  RETURN_IF_ERROR(ValidateConfig(config));
  RETURN_IF_ERROR(ValidateWeights(config, weights, options.mlp != nullptr));
  if (options.mlp != nullptr) {
    const mlp::MlpShape s = options.mlp->shape();
    if (s.first_layer != 0 || s.end_layer != config.num_layers ||
        s.hidden_size != config.hidden_size || s.intermediate_size != config.intermediate_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "CPU runner: the %s MLP backend serves layers %d:%d of hidden %d, intermediate %d; the "
          "model has %d layers of hidden %d, intermediate %d",
          std::string(options.mlp->name()), s.first_layer, s.end_layer, s.hidden_size,
          s.intermediate_size, config.num_layers, config.hidden_size, config.intermediate_size));
    }
  }
  if (options.block_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CPU runner: block_size %d must be positive", options.block_size));
  }
  if (options.mlp_micro_batches < 0 || options.mlp_micro_batches > 16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CPU runner: mlp_micro_batches %d (0: chosen from measured times, 1-16: fixed)",
        options.mlp_micro_batches));
  }
  const size_t block_bytes = 2 * sizeof(float) * static_cast<size_t>(config.num_layers) *
                             options.block_size * config.num_kv_heads * config.head_dim;
  int64_t num_blocks = options.num_blocks;
  if (num_blocks == 0) num_blocks = static_cast<int64_t>(options.kv_cache_bytes / block_bytes);
  if (num_blocks <= 0 || num_blocks > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CPU runner: %d KV blocks (num_blocks %d, kv_cache_bytes %d, %d bytes per block)",
        num_blocks, options.num_blocks, options.kv_cache_bytes, block_bytes));
  }
  auto runner = std::make_unique<CpuModelRunner>(config, std::move(weights), options.block_size,
                                                 static_cast<int>(num_blocks), options.mlp,
                                                 options.mlp_micro_batches);
  if (!runner->Init()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("CPU runner: cannot allocate fused weights and %d KV blocks of %d bytes",
                        num_blocks, block_bytes));
  }
  return std::unique_ptr<ModelRunner>(std::move(runner));
}

}  // namespace tandem
