#include "runtime/device/caching_allocator.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace tandem {
namespace {

// A backend with a fixed capacity that records what is outstanding.
class FakeRawAllocator : public RawAllocator {
 public:
  explicit FakeRawAllocator(size_t capacity) : capacity_(capacity) {}
  ~FakeRawAllocator() override {
    for (auto& [ptr, size] : live_) std::free(ptr);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    ++calls;
    EXPECT_EQ(bytes % 512, 0u) << "the pool must hand the backend rounded sizes";
    if (used_ + bytes > capacity_) return absl::ResourceExhaustedError("fake out of memory");
    void* ptr = std::aligned_alloc(256, bytes);
    live_[ptr] = bytes;
    used_ += bytes;
    return ptr;
  }

  void Free(void* ptr) override {
    auto it = live_.find(ptr);
    ASSERT_NE(it, live_.end()) << "pool freed a block the backend never gave";
    used_ -= it->second;
    live_.erase(it);
    std::free(ptr);
  }

  size_t used() const { return used_; }
  size_t live_blocks() const { return live_.size(); }
  int calls = 0;

 private:
  size_t capacity_;
  size_t used_ = 0;
  absl::flat_hash_map<void*, size_t> live_;
};

TEST(CachingAllocatorTest, RoundsToSizeClasses) {
  EXPECT_EQ(CachingAllocator::RoundUp(1), 512u);
  EXPECT_EQ(CachingAllocator::RoundUp(512), 512u);
  EXPECT_EQ(CachingAllocator::RoundUp(513), 1024u);
  EXPECT_EQ(CachingAllocator::RoundUp((1 << 20) - 1), size_t{1} << 20);
  EXPECT_EQ(CachingAllocator::RoundUp((1 << 20) + 1), size_t{2} << 20);
}

TEST(CachingAllocatorTest, ReusesFreedBlockOfTheSameClass) {
  FakeRawAllocator raw(1 << 24);
  CachingAllocator pool(&raw);
  absl::StatusOr<void*> a = pool.Allocate(1000);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(pool.Free(*a).ok());
  EXPECT_EQ(pool.stats().bytes_cached, 1024u);
  absl::StatusOr<void*> b = pool.Allocate(900);  // same 1024-byte class
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, *a);
  EXPECT_EQ(raw.calls, 1);
  EXPECT_EQ(pool.stats().backend_allocations, 1u);
  EXPECT_EQ(pool.stats().bytes_in_use, 1024u);
  EXPECT_EQ(pool.stats().bytes_cached, 0u);
  absl::StatusOr<void*> c = pool.Allocate(2000);  // another class: a new block
  ASSERT_TRUE(c.ok());
  EXPECT_NE(*c, *a);
  EXPECT_EQ(raw.calls, 2);
}

TEST(CachingAllocatorTest, SteadyStateStepsDoNotCallTheBackend) {
  FakeRawAllocator raw(1 << 26);
  CachingAllocator pool(&raw);
  const std::vector<size_t> step_sizes = {4096, 100, 3 << 20, 65536, 100};
  for (int step = 0; step < 20; ++step) {
    std::vector<void*> held;
    for (size_t s : step_sizes) {
      absl::StatusOr<void*> p = pool.Allocate(s);
      ASSERT_TRUE(p.ok());
      held.push_back(*p);
    }
    for (void* p : held) ASSERT_TRUE(pool.Free(p).ok());
  }
  EXPECT_EQ(raw.calls, static_cast<int>(step_sizes.size()));
}

TEST(CachingAllocatorTest, RejectsUnknownAndDoubleFree) {
  FakeRawAllocator raw(1 << 20);
  CachingAllocator pool(&raw);
  int not_ours = 0;
  EXPECT_EQ(pool.Free(&not_ours).code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<void*> a = pool.Allocate(64);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(pool.Free(static_cast<char*>(*a) + 1).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(pool.Free(*a).ok());
  EXPECT_EQ(pool.Free(*a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.stats().bytes_cached, 512u);
}

TEST(CachingAllocatorTest, RejectsZeroAndAbsurdSizesWithoutTheBackend) {
  FakeRawAllocator raw(1 << 20);
  CachingAllocator pool(&raw);
  EXPECT_EQ(pool.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pool.Allocate(SIZE_MAX).status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(raw.calls, 0);
}

TEST(CachingAllocatorTest, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeRawAllocator raw(8192);
  CachingAllocator pool(&raw);
  absl::StatusOr<void*> small = pool.Allocate(4096);
  ASSERT_TRUE(small.ok());
  ASSERT_TRUE(pool.Free(*small).ok());  // cached: the backend still holds 4096
  absl::StatusOr<void*> big = pool.Allocate(8192);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(pool.stats().bytes_cached, 0u);
  EXPECT_EQ(pool.stats().backend_frees, 1u);
  EXPECT_EQ(raw.used(), 8192u);
}

TEST(CachingAllocatorTest, OutOfMemoryWithNothingCachedLeavesThePoolAsItWas) {
  FakeRawAllocator raw(4096);
  CachingAllocator pool(&raw);
  absl::StatusOr<void*> a = pool.Allocate(4096);
  ASSERT_TRUE(a.ok());
  const DeviceMemoryStats before = pool.stats();
  absl::StatusOr<void*> b = pool.Allocate(512);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool.stats().bytes_in_use, before.bytes_in_use);
  EXPECT_EQ(pool.stats().bytes_cached, before.bytes_cached);
  EXPECT_TRUE(pool.Free(*a).ok());
}

TEST(CachingAllocatorTest, DestructionReturnsEverythingToTheBackend) {
  FakeRawAllocator raw(1 << 20);
  {
    CachingAllocator pool(&raw);
    absl::StatusOr<void*> in_use = pool.Allocate(1000);
    absl::StatusOr<void*> cached = pool.Allocate(5000);
    ASSERT_TRUE(in_use.ok() && cached.ok());
    ASSERT_TRUE(pool.Free(*cached).ok());
    EXPECT_EQ(raw.live_blocks(), 2u);
  }
  EXPECT_EQ(raw.live_blocks(), 0u);
  EXPECT_EQ(raw.used(), 0u);
}

}  // namespace
}  // namespace tandem
