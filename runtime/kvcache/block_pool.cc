#include "runtime/kvcache/block_pool.h"

#include <algorithm>

#include "runtime/base/logging.h"

namespace tandem {
namespace {

uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t HashBlockTokens(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = Mix64(parent_hash ^ 0x6a09e667f3bcc908ULL);
  for (int32_t t : tokens) {
    h = Mix64(h ^ (static_cast<uint64_t>(static_cast<uint32_t>(t)) + 0x9e3779b97f4a7c15ULL));
  }
  return Mix64(h ^ tokens.size());
}

std::vector<uint64_t> PrefixBlockHashes(std::span<const int32_t> tokens, int block_size,
                                        int max_blocks) {
  std::vector<uint64_t> hashes;
  if (block_size <= 0) return hashes;
  const int full = static_cast<int>(tokens.size() / static_cast<size_t>(block_size));
  const int n = std::min(full, max_blocks);
  hashes.reserve(std::max(n, 0));
  uint64_t parent = kRootBlockHash;
  for (int i = 0; i < n; ++i) {
    parent = HashBlockTokens(parent, tokens.subspan(static_cast<size_t>(i) * block_size,
                                                    static_cast<size_t>(block_size)));
    hashes.push_back(parent);
  }
  return hashes;
}

BlockPool::BlockPool(int num_blocks) : blocks_(num_blocks) {
  CHECK_GT(num_blocks, 0);
  free_list_.reserve(num_blocks);
  // LIFO: push high ids first so block 0 is handed out first (readable tests and dumps).
  for (int32_t b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);
}

int32_t BlockPool::Allocate() {
  int32_t block;
  if (!free_list_.empty()) {
    block = free_list_.back();
    free_list_.pop_back();
  } else {
    CHECK(!evictable_.empty()) << "BlockPool::Allocate with no available block";
    block = evictable_.front();
    Evict(block);
  }
  Block& b = blocks_[block];
  CHECK_EQ(b.ref, 0);
  CHECK(!b.hashed);
  b.ref = 1;
  return block;
}

void BlockPool::Evict(int32_t block) {
  Block& b = blocks_[block];
  CHECK(b.lru_pos.has_value());
  evictable_.erase(*b.lru_pos);
  b.lru_pos.reset();
  CHECK(b.hashed);
  auto it = hash_to_block_.find(b.hash);
  CHECK(it != hash_to_block_.end() && it->second == block);
  hash_to_block_.erase(it);
  if (record_events_) {
    events_.push_back({.kind = PrefixCacheEvent::Kind::kRemoved, .block_hash = b.hash});
  }
  b.hashed = false;
  b.tokens.clear();
}

void BlockPool::Ref(int32_t block) {
  CHECK(block >= 0 && block < num_blocks());
  Block& b = blocks_[block];
  if (b.ref == 0) {
    CHECK(b.lru_pos.has_value()) << "Ref of a free block " << block;
    evictable_.erase(*b.lru_pos);
    b.lru_pos.reset();
  }
  ++b.ref;
}

void BlockPool::Unref(int32_t block) {
  CHECK(block >= 0 && block < num_blocks());
  Block& b = blocks_[block];
  CHECK_GT(b.ref, 0) << "double free of block " << block;
  if (--b.ref > 0) return;
  if (b.hashed) {
    b.lru_pos = evictable_.insert(evictable_.end(), block);
  } else {
    free_list_.push_back(block);
  }
}

int32_t BlockPool::Lookup(uint64_t hash, uint64_t parent_hash,
                          std::span<const int32_t> tokens) const {
  auto it = hash_to_block_.find(hash);
  if (it == hash_to_block_.end()) return -1;
  const Block& b = blocks_[it->second];
  if (b.parent_hash != parent_hash ||
      !std::equal(b.tokens.begin(), b.tokens.end(), tokens.begin(), tokens.end())) {
    return -1;
  }
  return it->second;
}

bool BlockPool::Register(int32_t block, uint64_t hash, uint64_t parent_hash,
                         std::span<const int32_t> tokens) {
  Block& b = blocks_[block];
  CHECK_GT(b.ref, 0);
  if (b.hashed) return b.hash == hash;
  if (hash_to_block_.contains(hash)) return false;
  hash_to_block_[hash] = block;
  b.hashed = true;
  b.hash = hash;
  b.parent_hash = parent_hash;
  b.tokens.assign(tokens.begin(), tokens.end());
  if (record_events_) {
    events_.push_back({.kind = PrefixCacheEvent::Kind::kStored, .block_hash = hash});
  }
  return true;
}

void BlockPool::CheckConsistency() const {
  std::vector<int> seen(blocks_.size(), 0);
  for (int32_t b : free_list_) {
    CHECK(b >= 0 && b < num_blocks());
    CHECK_EQ(seen[b]++, 0) << "block " << b << " twice on the free list";
    CHECK_EQ(blocks_[b].ref, 0);
    CHECK(!blocks_[b].hashed);
    CHECK(!blocks_[b].lru_pos.has_value());
  }
  for (int32_t b : evictable_) {
    CHECK_EQ(seen[b]++, 0) << "block " << b << " both free and evictable";
    CHECK_EQ(blocks_[b].ref, 0);
    CHECK(blocks_[b].hashed);
    CHECK(blocks_[b].lru_pos.has_value());
  }
  size_t num_hashed = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    const Block& blk = blocks_[b];
    CHECK_GE(blk.ref, 0);
    if (seen[b] == 0) CHECK_GT(blk.ref, 0) << "block " << b << " leaked (ref 0, not free)";
    if (blk.hashed) {
      ++num_hashed;
      auto it = hash_to_block_.find(blk.hash);
      CHECK(it != hash_to_block_.end() && it->second == b);
    }
  }
  CHECK_EQ(num_hashed, hash_to_block_.size());
}

KvCacheManager::KvCacheManager(int num_blocks, int block_size, bool enable_prefix_caching)
    : block_size_(block_size), enable_prefix_caching_(enable_prefix_caching), pool_(num_blocks) {
  CHECK_GT(block_size, 0);
}

PrefixMatch KvCacheManager::FindCachedPrefix(std::span<const int32_t> tokens) const {
  PrefixMatch match;
  if (!enable_prefix_caching_ || tokens.empty()) return match;
  const int max_blocks = static_cast<int>(tokens.size() - 1) / block_size_;
  uint64_t parent = kRootBlockHash;
  for (int i = 0; i < max_blocks; ++i) {
    auto block_tokens = tokens.subspan(static_cast<size_t>(i) * block_size_, block_size_);
    const uint64_t h = HashBlockTokens(parent, block_tokens);
    const int32_t block = pool_.Lookup(h, parent, block_tokens);
    if (block < 0) break;
    match.blocks.push_back(block);
    match.hashes.push_back(h);
    parent = h;
  }
  return match;
}

int KvCacheManager::NumNewBlocksNeeded(int64_t seq_id, const PrefixMatch* match,
                                       int num_total_tokens) const {
  auto it = tables_.find(seq_id);
  const int held = it != tables_.end() ? static_cast<int>(it->second.blocks.size())
                   : match != nullptr  ? static_cast<int>(match->blocks.size())
                                       : 0;
  return std::max(0, BlocksFor(num_total_tokens) - held);
}

bool KvCacheManager::CanAllocate(int64_t seq_id, const PrefixMatch* match,
                                 int num_total_tokens) const {
  int needed = NumNewBlocksNeeded(seq_id, match, num_total_tokens);
  if (match != nullptr && !tables_.contains(seq_id)) {
    // Hit blocks that sit idle in the LRU list stop being available once referenced.
    for (int32_t b : match->blocks) needed += pool_.IsCachedIdle(b) ? 1 : 0;
  }
  return needed <= pool_.NumAvailable();
}

void KvCacheManager::Allocate(int64_t seq_id, const PrefixMatch* match, int num_total_tokens,
                              int num_prompt_tokens) {
  CHECK(CanAllocate(seq_id, match, num_total_tokens)) << "Allocate without CanAllocate";
  auto [it, inserted] = tables_.try_emplace(seq_id);
  Table& table = it->second;
  if (inserted) {
    counters_.prefix_queries_tokens += num_prompt_tokens;
    if (match != nullptr) {
      for (size_t i = 0; i < match->blocks.size(); ++i) {
        pool_.Ref(match->blocks[i]);
        table.blocks.push_back(match->blocks[i]);
        table.hashes.push_back(match->hashes[i]);
      }
      counters_.prefix_hit_tokens += match->num_tokens(block_size_);
    }
  }
  const int target = BlocksFor(num_total_tokens);
  while (static_cast<int>(table.blocks.size()) < target) table.blocks.push_back(pool_.Allocate());
}

void KvCacheManager::CommitComputed(int64_t seq_id, std::span<const int32_t> tokens,
                                    int num_computed) {
  auto it = tables_.find(seq_id);
  CHECK(it != tables_.end());
  Table& table = it->second;
  CHECK_LE(num_computed, static_cast<int>(tokens.size()));
  const int full = std::min<int>(num_computed / block_size_, table.blocks.size());
  while (static_cast<int>(table.hashes.size()) < full) {
    const size_t i = table.hashes.size();
    const uint64_t parent = i == 0 ? kRootBlockHash : table.hashes[i - 1];
    auto block_tokens = tokens.subspan(i * block_size_, block_size_);
    const uint64_t h = HashBlockTokens(parent, block_tokens);
    if (enable_prefix_caching_) pool_.Register(table.blocks[i], h, parent, block_tokens);
    table.hashes.push_back(h);
  }
}

void KvCacheManager::Free(int64_t seq_id) {
  auto it = tables_.find(seq_id);
  if (it == tables_.end()) return;
  const std::vector<int32_t>& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.Unref(*b);
  tables_.erase(it);
}

std::span<const int32_t> KvCacheManager::BlockTable(int64_t seq_id) const {
  auto it = tables_.find(seq_id);
  CHECK(it != tables_.end()) << "no block table for sequence " << seq_id;
  return it->second.blocks;
}

void KvCacheManager::CheckInvariants() const {
  pool_.CheckConsistency();
  std::vector<int> refs(pool_.num_blocks(), 0);
  for (const auto& [id, table] : tables_) {
    CHECK_LE(table.hashes.size(), table.blocks.size());
    for (int32_t b : table.blocks) ++refs[b];
  }
  for (int32_t b = 0; b < pool_.num_blocks(); ++b) {
    CHECK_EQ(refs[b], pool_.ref_count(b)) << "ref count mismatch for block " << b;
  }
}

}  // namespace tandem
