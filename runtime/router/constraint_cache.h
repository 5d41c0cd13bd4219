#pragma once
// The router's cache of compiled structured-output constraints: what a JSON Schema, a GBNF
// grammar, a regex or a tool set compiled to (the regex the workers get), or the error it gave,
// keyed by the request's text of it. vLLM users send the same schema with every request, and a
// 50-property schema costs ~20 ms to compile and a recursive grammar up to ~0.4 s, so repeats
// are lookups. Errors are cached too: a bad schema sent again costs nothing either.
//
// Bounded: at most `max_entries` entries and `max_bytes` of keys and values; the least recently
// used go first. A result bigger than max_bytes / 8 is returned but not kept.
//
// Thread-safety: thread-safe (one lock; compiling runs outside it, so two threads missing on the
// same key both compile, and the first result stays).

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tandem::router {

class ConstraintCache {
 public:
  ConstraintCache(size_t max_entries, size_t max_bytes)
      : max_entries_(max_entries), max_bytes_(max_bytes) {}

  // The process-wide cache the request parsers use: 256 entries, 16 MiB.
  static ConstraintCache& Shared();

  absl::StatusOr<std::string> GetOrCompile(
      const std::string& key, absl::FunctionRef<absl::StatusOr<std::string>()> compile);

  struct Stats {
    int64_t hits = 0;
    int64_t misses = 0;
    size_t entries = 0;
    size_t bytes = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string key;
    absl::StatusOr<std::string> value;
    size_t bytes = 0;
  };
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_entries_;
  const size_t max_bytes_;
  mutable absl::Mutex mu_;
  std::list<Entry> lru_ ABSL_GUARDED_BY(mu_);  // most recent first
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tandem::router
