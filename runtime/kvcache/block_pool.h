#pragma once
// Paged KV block accounting with a prefix cache (vLLM v1 / nano-vllm style). Host-only logic over
// plain data: the model runner owns the KV memory, this class only hands out block ids.
//
// - BlockPool: a fixed number of blocks with reference counts. A block is in exactly one state:
//   free (ref 0, no hash, on the free list), cached-idle (ref 0, hashed, evictable in LRU order),
//   or used (ref > 0, hashed or not).
// - Prefix cache: a full, computed block is registered under a chained hash of (parent block's
//   hash, the block's token ids). A new sequence whose leading full blocks match reuses them
//   (ref count + 1) instead of recomputing. Lookups verify the stored token ids, so a 64-bit hash
//   collision can never alias different content. When the free list is empty, allocation evicts
//   the least recently released cached-idle block.
// - KvCacheManager: per-sequence block tables on top of the pool. Plan with the const methods
//   (FindCachedPrefix, CanAllocate), then apply with Allocate / CommitComputed / Free.
//
// Thread-safety: none; owned by the engine thread. Failures: every method either succeeds or
// CHECK-fails on a broken invariant (callers must plan with CanAllocate first); nothing here
// depends on outside input.

#include <cstdint>
#include <list>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "runtime/kvcache/prefix_cache_events.h"

namespace tandem {

// Chained hash of one full block: deterministic across processes (for cross-worker routing).
uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int32_t> tokens);
inline constexpr uint64_t kRootBlockHash = 0x9e3779b97f4a7c15ULL;
// The chained hashes of the leading full blocks of `tokens` (at most `max_blocks`), as the prefix
// cache registers them: what a router compares against a worker's prefix-cache events.
std::vector<uint64_t> PrefixBlockHashes(std::span<const int32_t> tokens, int block_size,
                                        int max_blocks);

class BlockPool {
 public:
  explicit BlockPool(int num_blocks);

  int num_blocks() const { return static_cast<int>(blocks_.size()); }
  // Blocks an allocation may take: free + cached-idle (evictable).
  int NumAvailable() const { return static_cast<int>(free_list_.size() + evictable_.size()); }
  int NumFree() const { return static_cast<int>(free_list_.size()); }
  int NumCachedIdle() const { return static_cast<int>(evictable_.size()); }
  int NumUsed() const { return num_blocks() - NumAvailable(); }

  // Takes a block (ref 1) from the free list, else evicts the LRU cached-idle block.
  // CHECK-fails when none is available.
  int32_t Allocate();
  // Adds a reference to a block (a prefix-cache hit). A cached-idle block leaves the LRU list.
  void Ref(int32_t block);
  // Drops a reference; at 0 a hashed block becomes cached-idle (most recently used end),
  // an unhashed one returns to the free list.
  void Unref(int32_t block);

  // Prefix cache. Returns the cached block holding exactly (parent_hash, tokens), or -1.
  int32_t Lookup(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const;
  // Registers a used, unhashed, full block under `hash`. Returns false (and leaves the block
  // unhashed) if that hash is already cached by another block.
  bool Register(int32_t block, uint64_t hash, uint64_t parent_hash,
                std::span<const int32_t> tokens);
  bool IsCachedIdle(int32_t block) const { return blocks_[block].lru_pos.has_value(); }
  int ref_count(int32_t block) const { return blocks_[block].ref; }
  int NumCachedBlocks() const { return static_cast<int>(hash_to_block_.size()); }

  // Verifies internal consistency (states partition the blocks, the hash map matches the
  // blocks' hashes). CHECK-fails on a violation. For tests.
  void CheckConsistency() const;

  // Prefix-cache events: once on, every successful Register appends kStored and every eviction
  // kRemoved, in order, until TakeEvents hands them over.
  void set_record_events(bool on) { record_events_ = on; }
  std::vector<PrefixCacheEvent> TakeEvents() { return std::exchange(events_, {}); }

 private:
  struct Block {
    int ref = 0;
    bool hashed = false;
    uint64_t hash = 0;
    uint64_t parent_hash = 0;
    std::vector<int32_t> tokens;  // the block's token ids when hashed
    std::optional<std::list<int32_t>::iterator> lru_pos;
  };
  void Evict(int32_t block);

  std::vector<Block> blocks_;
  std::vector<int32_t> free_list_;  // LIFO of free, unhashed blocks
  std::list<int32_t> evictable_;    // cached-idle blocks, least recently released first
  absl::flat_hash_map<uint64_t, int32_t> hash_to_block_;
  bool record_events_ = false;
  std::vector<PrefixCacheEvent> events_;
};

// A prefix-cache match for a token sequence: the leading full blocks that are cached.
struct PrefixMatch {
  std::vector<int32_t> blocks;
  std::vector<uint64_t> hashes;  // hash of each matched block (chained)
  int num_tokens(int block_size) const { return static_cast<int>(blocks.size()) * block_size; }
};

struct KvCacheCounters {
  int64_t prefix_queries_tokens = 0;  // prompt tokens looked up at admission
  int64_t prefix_hit_tokens = 0;      // of which served from the cache
};

class KvCacheManager {
 public:
  KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching);

  int block_size() const { return block_size_; }
  const BlockPool& pool() const { return pool_; }
  const KvCacheCounters& counters() const { return counters_; }

  // The cached leading full blocks of `tokens`, leaving at least one token to compute (the
  // last token's logits are needed). Empty when prefix caching is off.
  PrefixMatch FindCachedPrefix(std::span<const int32_t> tokens) const;
  // Whether Allocate(seq_id, match, num_total_tokens) would succeed. `match` only for a
  // sequence without a table yet (admission); nullptr otherwise.
  bool CanAllocate(int64_t seq_id, const PrefixMatch* match, int num_total_tokens) const;
  // Blocks a sequence needs beyond what it holds to cover `num_total_tokens`.
  int NumNewBlocksNeeded(int64_t seq_id, const PrefixMatch* match, int num_total_tokens) const;
  // Creates the table on first call (taking `match`'s blocks and recording the hit counters over
  // `num_prompt_tokens`), then appends blocks so that it covers `num_total_tokens` positions.
  void Allocate(int64_t seq_id, const PrefixMatch* match, int num_total_tokens,
                int num_prompt_tokens = 0);
  // KV of tokens[0, num_computed) is now written: registers the sequence's newly full blocks
  // in the prefix cache.
  void CommitComputed(int64_t seq_id, std::span<const int32_t> tokens, int num_computed);
  // Releases the sequence's blocks (tail first, so shared prefixes stay cached longest).
  // No-op for an unknown id.
  void Free(int64_t seq_id);

  bool HasTable(int64_t seq_id) const { return tables_.contains(seq_id); }
  // Valid until the next non-const call.
  std::span<const int32_t> BlockTable(int64_t seq_id) const;
  int NumSequences() const { return static_cast<int>(tables_.size()); }

  // Verifies that every block's ref count equals the number of tables holding it and that the
  // pool is consistent. CHECK-fails on a violation. For tests.
  void CheckInvariants() const;

  // Prefix-cache events (BlockPool::set_record_events / TakeEvents); off by default.
  void set_record_events(bool on) { pool_.set_record_events(on); }
  std::vector<PrefixCacheEvent> TakeEvents() { return pool_.TakeEvents(); }

 private:
  struct Table {
    std::vector<int32_t> blocks;
    std::vector<uint64_t> hashes;  // hashes of blocks[0, hashes.size()) (full, committed)
  };
  int BlocksFor(int num_tokens) const { return (num_tokens + block_size_ - 1) / block_size_; }

  int block_size_;
  bool enable_prefix_caching_;
  BlockPool pool_;
  absl::flat_hash_map<int64_t, Table> tables_;
  KvCacheCounters counters_;
};

}  // namespace tandem
