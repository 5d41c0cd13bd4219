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

#include <cstdint>
#include <cstring>
#include <optional>
#include <span>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/base/logging.h"
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
