#pragma once
// Prefix-cache events: what a worker's prefix cache stored and evicted, numbered, so that a router
// can keep an index of which worker holds which prompt prefix (KV-aware routing, docs/routing.md).
//
// - PrefixCacheEvent: one block hash (the chained HashBlockTokens of block_pool.h) entering
//   (kStored) or leaving (kRemoved) the cache. BlockPool records them in order when asked to.
// - PrefixCacheEventLog: the engine thread appends each step's events; readers on other threads
//   ask for what follows their cursor. Every event gets the next sequence number (1, 2, ...). The
//   log keeps the last `capacity` events and a mirror of the hashes cached now, so a reader that
//   is new, or that fell further behind than the log reaches, gets a full snapshot (reset) instead
//   of a delta with a hole in it.
//
// A reader's contract: apply a delta only when its first_seq is the reader's last_seq + 1; a
// snapshot replaces everything the reader had. After either, the reader's cursor is last_seq.
//
// Thread-safety: PrefixCacheEventLog is thread-safe (one mutex, held for copies only).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"

namespace tandem {

struct PrefixCacheEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  uint64_t block_hash = 0;
  bool operator==(const PrefixCacheEvent&) const = default;
};

struct PrefixCacheDelta {
  // True: `events` are kStored events for every hash cached as of last_seq and replace the
  // reader's view. False: the events numbered first_seq .. last_seq (possibly none).
  bool reset = false;
  uint64_t first_seq = 0;
  uint64_t last_seq = 0;  // the reader's cursor after applying this
  std::vector<PrefixCacheEvent> events;
};

class PrefixCacheEventLog {
 public:
  static constexpr size_t kDefaultCapacity = 1 << 16;
  explicit PrefixCacheEventLog(size_t capacity = kDefaultCapacity);

  // Engine thread. Appends in order, numbering from last_seq() + 1.
  void Append(std::span<const PrefixCacheEvent> events);

  // What a reader at `cursor` (the last_seq of what it applied; nullopt: nothing yet) needs: a
  // delta of at most `max_events` events when the log still holds every event after `cursor`, a
  // snapshot otherwise. A cursor ahead of the log (from an earlier process) also gets a snapshot.
  PrefixCacheDelta ReadSince(std::optional<uint64_t> cursor, size_t max_events) const;

  uint64_t last_seq() const;
  size_t num_cached() const;

 private:
  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<PrefixCacheEvent> ring_ ABSL_GUARDED_BY(mu_);  // events first_seq_ .. last_seq_
  uint64_t first_seq_ ABSL_GUARDED_BY(mu_) = 1;             // seq of ring_.front()
  uint64_t last_seq_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_set<uint64_t> cached_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem
