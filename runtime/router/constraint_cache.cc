#include "runtime/router/constraint_cache.h"

#include <utility>

namespace tandem::router {

ConstraintCache& ConstraintCache::Shared() {
  static ConstraintCache* cache = new ConstraintCache(256, 16 << 20);
  return *cache;
}

absl::StatusOr<std::string> ConstraintCache::GetOrCompile(
    const std::string& key, absl::FunctionRef<absl::StatusOr<std::string>()> compile) {
  {
    absl::MutexLock lock(&mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      lru_.splice(lru_.begin(), lru_, it->second);
      ++hits_;
      return it->second->value;
    }
    ++misses_;
  }
  absl::StatusOr<std::string> value = compile();
  const size_t bytes =
      key.size() + (value.ok() ? value->size() : value.status().message().size()) + 64;
  if (bytes > max_bytes_ / 8) return value;
  absl::MutexLock lock(&mu_);
  if (index_.contains(key)) return value;  // another thread compiled it meanwhile
  lru_.push_front(Entry{key, value, bytes});
  index_[key] = lru_.begin();
  bytes_ += bytes;
  EvictLocked();
  return value;
}

void ConstraintCache::EvictLocked() {
  while (!lru_.empty() && (lru_.size() > max_entries_ || bytes_ > max_bytes_)) {
    bytes_ -= lru_.back().bytes;
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
}

ConstraintCache::Stats ConstraintCache::stats() const {
  absl::MutexLock lock(&mu_);
  return Stats{hits_, misses_, lru_.size(), bytes_};
}

}  // namespace tandem::router
