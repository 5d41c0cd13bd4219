#pragma once
// Test-only helpers for engine disaggregation tests.
//
// CopyPromptKv is a stand-in for kvtransfer: it copies a prompt's KV from one engine's cache to
// another's with memcpy, addressing blocks with the KvCacheLayout formula. Blocks wholly inside
// the first `skip_tokens` tokens (the destination's prefix-cache hit) are not copied, as a real
// transfer must not write them (they may be shared with other sequences). The caller guarantees
// that the source blocks are held and the destination blocks reserved (neither engine touches
// them meanwhile).
//
// Waitable<T>: a value set once from another thread (an engine callback), awaited by the test.
//
// ReserveRemotePrefill submits a remote prefill on a decode-side engine and waits (with
// Waitable's deadline) for its reservation; RandomPrompt draws prompt tokens.

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/base/logging.h"
#include "runtime/engine/engine.h"
#include "runtime/model/model_runner.h"

namespace tandem {

template <typename T>
class Waitable {
 public:
  void Set(T value) {
    absl::MutexLock lock(&mu_);
    value_ = std::move(value);
    ++sets_;
  }
  // The value, or nullopt after `timeout`.
  std::optional<T> Wait(absl::Duration timeout = absl::Seconds(30)) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return value_.has_value(); };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    return value_;
  }
  int sets() {
    absl::MutexLock lock(&mu_);
    return sets_;
  }

 private:
  absl::Mutex mu_;
  std::optional<T> value_ ABSL_GUARDED_BY(mu_);
  int sets_ ABSL_GUARDED_BY(mu_) = 0;
};

// The reservation of a remote prefill submitted on `engine`, or the error (DeadlineExceeded when
// on_reserved never came).
inline absl::StatusOr<RemoteKvReservation> ReserveRemotePrefill(Engine& engine,
                                                                GenerateRequest request) {
  auto slot = std::make_shared<Waitable<absl::StatusOr<RemoteKvReservation>>>();
  absl::Status s = engine.SubmitRemotePrefill(
      std::move(request), [slot](absl::StatusOr<RemoteKvReservation> r) { slot->Set(r); });
  if (!s.ok()) return s;
  auto r = slot->Wait();
  if (!r.has_value()) return absl::DeadlineExceededError("no on_reserved");
  return *r;
}

// `len` tokens drawn uniformly from [0, vocab).
inline std::vector<int32_t> RandomPrompt(std::mt19937& rng, int len, int vocab) {
  std::vector<int32_t> p(len);
  for (auto& t : p) t = static_cast<int32_t>(rng() % vocab);
  return p;
}

// Returns the number of blocks copied (each over every layer, K and V).
inline int CopyPromptKv(const KvCacheLayout& src, std::span<const int32_t> src_blocks,
                        const KvCacheLayout& dst, std::span<const int32_t> dst_blocks,
                        int num_tokens, int skip_tokens) {
  CHECK_EQ(src.num_layers, dst.num_layers);
  CHECK_EQ(src.block_size, dst.block_size);
  CHECK_EQ(src.block_bytes, dst.block_bytes);
  const int n = (num_tokens + src.block_size - 1) / src.block_size;
  CHECK_GE(static_cast<int>(src_blocks.size()), n);
  CHECK_GE(static_cast<int>(dst_blocks.size()), n);
  int copied = 0;
  for (int i = 0; i < n; ++i) {
    if ((i + 1) * src.block_size <= skip_tokens) continue;
    CHECK(src_blocks[i] >= 0 && src_blocks[i] < src.num_blocks);
    CHECK(dst_blocks[i] >= 0 && dst_blocks[i] < dst.num_blocks);
    for (int layer = 0; layer < src.num_layers; ++layer) {
      for (int kv = 0; kv < 2; ++kv) {
        std::memcpy(dst.BlockPtr(layer, kv, dst_blocks[i]), src.BlockPtr(layer, kv, src_blocks[i]),
                    src.block_bytes);
      }
    }
    ++copied;
  }
  return copied;
}

}  // namespace tandem
