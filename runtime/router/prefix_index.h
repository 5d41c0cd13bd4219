#pragma once
// The router's view of one worker's prefix cache, rebuilt from the worker's numbered prefix-cache
// events (worker.proto PrefixCacheEvents; kvcache/prefix_cache_events.h), for KV-aware routing.
//
// The view is a set of block hashes. A prompt's cached overlap on the worker is the number of its
// leading full blocks whose chained hashes are all in the set, which is what the worker's own
// prefix-cache lookup would reuse (an evicted middle block ends the match there too).
//
// Apply keeps the sequence contract: a reset replaces the view; a delta applies only when its
// first_seq follows the view's last_seq. On a gap the view is cleared and left unsynced, and
// Apply says so: the caller reopens the stream, whose first message is a snapshot. A view that
// is not synced matches nothing, so a worker whose events are lost is routed by load alone.
//
// Routed-but-unconfirmed prefixes: the worker publishes a prompt's blocks only once it has
// computed them, a few hundred milliseconds after the router chose it. NoteRouted records the
// prompt's hashes as pending until `expiry`, and they count as cached meanwhile; so a burst of
// requests sharing a new prefix follows the first one instead of scattering before any event
// arrives. The worker's events (stored, or removed) settle each hash; Clear drops them too.
//
// Thread-safety: none; WorkerPool guards each worker's index with that worker's mutex.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "runtime/kvcache/prefix_cache_events.h"

namespace tandem::router {

class WorkerPrefixIndex {
 public:
  // FailedPrecondition on a gap (the view is then cleared and unsynced); OK otherwise.
  absl::Status Apply(const PrefixCacheDelta& delta);
  // Forgets everything, predictions included (the stream broke: the worker may have restarted).
  void Clear();

  // Leading entries of `block_hashes` (a prompt's PrefixBlockHashes) that are all cached or
  // pending (unexpired at `now`).
  int MatchedBlocks(std::span<const uint64_t> block_hashes,
                    absl::Time now = absl::InfinitePast()) const;
  // The router sent a prompt with these block hashes to the worker: they count as cached until
  // `expiry` unless an event settles them first.
  void NoteRouted(std::span<const uint64_t> block_hashes, absl::Time expiry);
  size_t num_pending() const { return pending_.size(); }

  bool synced() const { return last_seq_.has_value(); }
  size_t num_blocks() const { return hashes_.size(); }
  int64_t resyncs() const { return resyncs_; }

 private:
  std::optional<uint64_t> last_seq_;
  absl::flat_hash_set<uint64_t> hashes_;
  absl::flat_hash_map<uint64_t, absl::Time> pending_;  // routed, not yet confirmed: expiry
  int64_t resyncs_ = 0;                                // snapshots applied after the first
};

}  // namespace tandem::router
