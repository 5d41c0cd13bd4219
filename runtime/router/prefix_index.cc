#include "runtime/router/prefix_index.h"

#include "absl/strings/str_cat.h"

namespace tandem::router {

absl::Status WorkerPrefixIndex::Apply(const PrefixCacheDelta& delta) {
  if (delta.reset) {
    if (last_seq_.has_value() || !hashes_.empty()) ++resyncs_;
    hashes_.clear();
  } else if (!last_seq_.has_value() || delta.first_seq != *last_seq_ + 1 ||
             delta.last_seq + 1 != delta.first_seq + delta.events.size()) {
    const std::string why =
        !last_seq_.has_value()
            ? std::string("a delta before any snapshot")
            : absl::StrCat("events ", delta.first_seq, "..", delta.last_seq, " after ", *last_seq_);
    Clear();
    return absl::FailedPreconditionError(absl::StrCat("prefix-cache event gap: ", why));
  }
  for (const PrefixCacheEvent& e : delta.events) {
    if (e.kind == PrefixCacheEvent::Kind::kStored) {
      hashes_.insert(e.block_hash);
    } else {
      hashes_.erase(e.block_hash);
    }
    pending_.erase(e.block_hash);  // the worker has spoken for this block
  }
  last_seq_ = delta.last_seq;
  return absl::OkStatus();
}

void WorkerPrefixIndex::Clear() {
  hashes_.clear();
  pending_.clear();
  last_seq_.reset();
}

int WorkerPrefixIndex::MatchedBlocks(std::span<const uint64_t> block_hashes, absl::Time now) const {
  if (!synced()) return 0;
  int n = 0;
  for (uint64_t h : block_hashes) {
    if (!hashes_.contains(h)) {
      auto it = pending_.find(h);
      if (it == pending_.end() || it->second <= now) break;
    }
    ++n;
  }
  return n;
}

void WorkerPrefixIndex::NoteRouted(std::span<const uint64_t> block_hashes, absl::Time expiry) {
  // Bounded: expired predictions go first, and a flood of new prompts cannot grow the map past
  // kMaxPending entries.
  constexpr size_t kMaxPending = 1 << 16;
  if (pending_.size() + block_hashes.size() > kMaxPending) {
    const absl::Time now = absl::Now();
    absl::erase_if(pending_, [now](const auto& entry) { return entry.second <= now; });
    if (pending_.size() + block_hashes.size() > kMaxPending) pending_.clear();
  }
  for (uint64_t h : block_hashes) {
    if (hashes_.contains(h)) continue;
    pending_[h] = expiry;
  }
}

}  // namespace tandem::router
