#include "runtime/kvcache/prefix_cache_events.h"

#include <algorithm>

#include "runtime/base/logging.h"

namespace tandem {

PrefixCacheEventLog::PrefixCacheEventLog(size_t capacity) : capacity_(capacity) {
  CHECK_GT(capacity, 0u);
}

void PrefixCacheEventLog::Append(std::span<const PrefixCacheEvent> events) {
  if (events.empty()) return;
  absl::MutexLock lock(&mu_);
  for (const PrefixCacheEvent& e : events) {
    if (e.kind == PrefixCacheEvent::Kind::kStored) {
      cached_.insert(e.block_hash);
    } else {
      cached_.erase(e.block_hash);
    }
    ring_.push_back(e);
    ++last_seq_;
  }
  while (ring_.size() > capacity_) {
    ring_.pop_front();
    ++first_seq_;
  }
}

PrefixCacheDelta PrefixCacheEventLog::ReadSince(std::optional<uint64_t> cursor,
                                                size_t max_events) const {
  absl::MutexLock lock(&mu_);
  PrefixCacheDelta delta;
  // The log holds every event after `cursor` when cursor + 1 >= first_seq_ (an empty ring's
  // first_seq_ is last_seq_ + 1).
  const bool can_delta = cursor.has_value() && *cursor <= last_seq_ && *cursor + 1 >= first_seq_;
  if (!can_delta) {
    delta.reset = true;
    delta.first_seq = last_seq_;
    delta.last_seq = last_seq_;
    delta.events.reserve(cached_.size());
    for (uint64_t hash : cached_) {
      delta.events.push_back({.kind = PrefixCacheEvent::Kind::kStored, .block_hash = hash});
    }
    return delta;
  }
  delta.first_seq = *cursor + 1;
  const uint64_t available = last_seq_ - *cursor;
  const uint64_t n = std::min<uint64_t>(available, max_events);
  const size_t begin = static_cast<size_t>(delta.first_seq - first_seq_);
  delta.events.assign(ring_.begin() + begin, ring_.begin() + begin + n);
  delta.last_seq = *cursor + n;
  return delta;
}

uint64_t PrefixCacheEventLog::last_seq() const {
  absl::MutexLock lock(&mu_);
  return last_seq_;
}

size_t PrefixCacheEventLog::num_cached() const {
  absl::MutexLock lock(&mu_);
  return cached_.size();
}

}  // namespace tandem
