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
  }
  last_seq_ = delta.last_seq;
  return absl::OkStatus();
}

void WorkerPrefixIndex::Clear() {
  hashes_.clear();
  last_seq_.reset();
}

int WorkerPrefixIndex::MatchedBlocks(std::span<const uint64_t> block_hashes) const {
  if (!synced()) return 0;
  int n = 0;
  for (uint64_t h : block_hashes) {
    if (!hashes_.contains(h)) break;
    ++n;
  }
  return n;
}

}  // namespace tandem::router
