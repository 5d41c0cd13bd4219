#include "runtime/engine/fake_model_runner.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/sampling/sampler.h"

namespace tandem {
namespace {

constexpr uint64_t kRoot = 0x243f6a8885a308d3ULL;

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

uint64_t Next(uint64_t parent, int32_t token, int pos) {
  return Mix(parent ^
             Mix(static_cast<uint64_t>(static_cast<uint32_t>(token)) * 0x9e3779b97f4a7c15ULL +
                 static_cast<uint64_t>(pos)));
}

void LogitsFromHash(uint64_t h, int vocab, float* out) {
  for (int v = 0; v < vocab; ++v) {
    const uint64_t bits = Mix(h + static_cast<uint64_t>(v) * 0xd1b54a32d192ed03ULL);
    out[v] = static_cast<float>(bits >> 40) / static_cast<float>(1 << 24) * 8.0f - 4.0f;
  }
}

}  // namespace

FakeModelRunner::FakeModelRunner(int vocab_size, int num_blocks, int block_size,
                                 int max_position_embeddings, std::vector<int> eos_token_ids)
    : num_blocks_(num_blocks),
      block_size_(block_size),
      slots_(2 * static_cast<size_t>(num_blocks) * block_size) {
  config_.vocab_size = vocab_size;
  config_.max_position_embeddings = max_position_embeddings;
  config_.eos_token_ids = std::move(eos_token_ids);
  config_.num_layers = 1;
}

KvCacheLayout FakeModelRunner::kv_layout() const {
  KvCacheLayout l;
  l.base = const_cast<Slot*>(slots_.data());
  l.bytes = slots_.size() * sizeof(Slot);
  l.num_layers = 1;
  l.num_blocks = num_blocks_;
  l.block_size = block_size_;
  l.num_kv_heads = 1;
  l.head_dim = sizeof(Slot);
  l.elem_bytes = 1;
  l.block_bytes = static_cast<size_t>(block_size_) * sizeof(Slot);
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * static_cast<size_t>(num_blocks_);
  l.layer_stride = 2 * l.kv_stride;
  return l;
}

absl::StatusOr<KvCacheLayout> FakeModelRunner::transfer_layout() {
  KvCacheLayout l = kv_layout();
  if (!mirror_.empty()) l.base = const_cast<Slot*>(mirror_.data());
  return l;
}

void FakeModelRunner::EnableTransferMirror() { mirror_.assign(slots_.size(), Slot{}); }

void FakeModelRunner::FailNextStages(int count, absl::Status status) {
  stage_fail_count_ = count;
  stage_fail_status_ = std::move(status);
}

absl::Status FakeModelRunner::StageKv(std::span<const int32_t> blocks, KvStage dir) {
  stage_calls_.push_back({dir, std::vector<int32_t>(blocks.begin(), blocks.end())});
  if (mirror_.empty()) return absl::OkStatus();
  for (int32_t b : blocks) {
    if (b < 0 || b >= num_blocks_) {
      return absl::InvalidArgumentError(absl::StrCat("StageKv: block id ", b, " out of range"));
    }
  }
  const bool fail = stage_fail_count_ > 0;
  if (fail) --stage_fail_count_;
  std::vector<Slot>& from = dir == KvStage::kToMirror ? slots_ : mirror_;
  std::vector<Slot>& to = dir == KvStage::kToMirror ? mirror_ : slots_;
  for (int32_t b : blocks) {
    for (int kv = 0; kv < 2; ++kv) {
      const size_t first = (static_cast<size_t>(kv) * num_blocks_ + b) * block_size_;
      for (size_t i = first; i < first + block_size_; ++i) to[i] = fail ? Slot{} : from[i];
    }
  }
  return fail ? stage_fail_status_ : absl::OkStatus();
}

std::vector<float> FakeModelRunner::ReferenceLogits(std::span<const int32_t> tokens,
                                                    int vocab_size) {
  uint64_t h = kRoot;
  for (size_t p = 0; p < tokens.size(); ++p) h = Next(h, tokens[p], static_cast<int>(p));
  std::vector<float> logits(vocab_size);
  LogitsFromHash(h, vocab_size, logits.data());
  return logits;
}

std::vector<int32_t> FakeModelRunner::ReferenceGreedy(std::vector<int32_t> prompt, int n,
                                                      int vocab_size,
                                                      const std::vector<int>& stop_ids,
                                                      int min_tokens) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    std::vector<float> logits = ReferenceLogits(prompt, vocab_size);
    if (i < min_tokens) {
      for (int t : stop_ids) logits[t] = -std::numeric_limits<float>::infinity();
    }
    const int32_t t =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    prompt.push_back(t);
    if (std::find(stop_ids.begin(), stop_ids.end(), t) != stop_ids.end()) break;
  }
  return out;
}

void FakeModelRunner::FailNextForwards(int count, absl::Status status) {
  fail_count_ = count;
  fail_status_ = std::move(status);
}

absl::Status FakeModelRunner::Violation(std::string message) {
  violations_.push_back(message);
  return absl::InternalError(message);
}

absl::Status FakeModelRunner::Forward(const ForwardBatch& batch, ForwardOutput* out) {
  if (forward_hook_) forward_hook_();
  ++forward_calls_;
  max_batch_chunks_ = std::max<int>(max_batch_chunks_, batch.chunks.size());
  out->logits.clear();
  out->rows = 0;
  for (const SequenceChunk& chunk : batch.chunks) {
    const int end = chunk.start_pos + static_cast<int>(chunk.tokens.size());
    if (chunk.tokens.empty() || chunk.start_pos < 0) return Violation("empty chunk");
    if (end > config_.max_position_embeddings) return Violation("position beyond the model");
    if (static_cast<int>(chunk.block_table.size()) * block_size_ < end) {
      return Violation(absl::StrCat("block table of ", chunk.block_table.size(),
                                    " blocks does not cover position ", end - 1));
    }
    for (int32_t b : chunk.block_table) {
      if (b < 0 || b >= num_blocks_) return Violation(absl::StrCat("bad block id ", b));
    }
  }
  if (fail_count_ > 0) {
    --fail_count_;
    return fail_status_;
  }
  for (const SequenceChunk& chunk : batch.chunks) {
    auto slot = [&](int pos, int kv = 0) -> Slot& {
      return At(kv, chunk.block_table[pos / block_size_], pos);
    };
    uint64_t h = kRoot;
    std::vector<uint64_t> hashes;  // after each token of the chunk
    if (chunk.start_pos > 0) {
      const Slot& prev = slot(chunk.start_pos - 1);
      if (!prev.written || prev.pos != chunk.start_pos - 1) {
        return Violation(absl::StrCat("position ", chunk.start_pos - 1, " read before written"));
      }
      h = prev.hash;
    }
    for (size_t i = 0; i < chunk.tokens.size(); ++i) {
      const int pos = chunk.start_pos + static_cast<int>(i);
      const uint64_t next = Next(h, chunk.tokens[i], pos);
      slot(pos, 0) = {1, pos, next, h};
      slot(pos, 1) = slot(pos, 0);
      h = next;
      hashes.push_back(h);
      ++tokens_computed_;
    }
    // Attention reads every position: all of them must hold one consistent history.
    const int end = chunk.start_pos + static_cast<int>(chunk.tokens.size());
    uint64_t parent = kRoot;
    for (int pos = 0; pos < end; ++pos) {
      const Slot& s = slot(pos);
      const Slot& v = slot(pos, 1);
      if (!s.written || s.pos != pos || s.parent != parent || v.written != s.written ||
          v.pos != s.pos || v.hash != s.hash || v.parent != s.parent) {
        return Violation(absl::StrCat("KV of position ", pos, " (block ",
                                      chunk.block_table[pos / block_size_],
                                      ") is not this sequence's history"));
      }
      parent = s.hash;
    }
    if (chunk.need_logits) {
      const int n = static_cast<int>(hashes.size());
      if (chunk.num_logits < 1 || chunk.num_logits > n) return Violation("bad num_logits");
      for (int k = chunk.num_logits; k >= 1; --k) {
        out->logits.resize(out->logits.size() + config_.vocab_size);
        LogitsFromHash(hashes[n - k], config_.vocab_size,
                       out->logits.data() + out->logits.size() - config_.vocab_size);
        ++out->rows;
      }
    }
  }
  // Its one layer's KV of the step is written: the layer progress (streaming transfers may
  // start reading it now, while this Forward is still "running" its remaining work).
  if (progress_enabled_) progress_.store(++progress_value_, std::memory_order_release);
  if (nan_count_ > 0) {
    --nan_count_;
    std::fill(out->logits.begin(), out->logits.end(), std::nanf(""));
  }
  const bool all_sampled =
      out->rows > 0 &&
      std::all_of(batch.chunks.begin(), batch.chunks.end(), [](const SequenceChunk& c) {
        return !c.need_logits || (c.sample && (c.num_logits == 1 || c.allowed.empty()));
      });
  if (device_sampling_ && all_sampled) {
    if (batch.masks_ready) {
      if (absl::Status s = batch.masks_ready(); !s.ok()) return s;
    }
    const size_t vocab = config_.vocab_size;
    int r = 0;
    for (const SequenceChunk& chunk : batch.chunks) {
      if (!chunk.need_logits) continue;
      for (int k = 0; k < chunk.num_logits; ++k) {
        const std::span<const float> row(out->logits.data() + r * vocab, vocab);
        const SampleResult s =
            std::any_of(row.begin(), row.end(), [](float x) { return std::isnan(x); })
                ? SampleResult{0, std::nanf(""), {}}
                : SampleFromRequest(chunk.sample[k], row, chunk.allowed);
        out->tokens.push_back(s.token);
        out->logprobs.push_back(s.logprob);
        ++runner_sampled_rows_;
        if (!chunk.allowed.empty()) ++masked_rows_;
        ++r;
      }
    }
    out->logits.clear();
  }
  return absl::OkStatus();
}

absl::Status FakeModelRunner::EnableKvProgress() {
  progress_enabled_ = true;
  return absl::OkStatus();
}

KvProgress FakeModelRunner::kv_progress() const {
  if (!progress_enabled_) return {};
  return KvProgress{.counter = reinterpret_cast<const volatile uint64_t*>(&progress_),
                    .next = progress_value_};
}

}  // namespace tandem
