#pragma once
// CachingAllocator: a size-class memory pool over a backend allocator (cudaMalloc, aligned host
// malloc), so that a steady-state engine step never calls the backend: freed blocks are kept per
// rounded size and handed out again. Host-only logic; the backend is injected, so it is tested
// without a GPU.
//
// Threading: not thread-safe; it belongs to one Device and so to the thread that owns it.
// Ownership: the allocator owns every block it got from the backend, in use or cached, and returns
// all of them to the backend when destroyed. The backend must outlive it.
// Failure: a failed Allocate leaves the pool as it was, except that on backend out-of-memory the
// cached blocks are released before the one retry. A failed Free changes nothing.

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace tandem {

// The memory a CachingAllocator draws from.
class RawAllocator {
 public:
  virtual ~RawAllocator() = default;
  // Returns a block of at least `bytes` (a multiple of 512), aligned to 256 bytes, or
  // kResourceExhausted when the backend is out of memory (other codes for other failures).
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  // Returns a block from Allocate. Failures are the backend's to report (they cannot be acted on).
  virtual void Free(void* ptr) = 0;
};

class CachingAllocator {
 public:
  // Requests are rounded up to a multiple of kSmallGranularity below kLargeThreshold, and to a
  // multiple of kLargeGranularity from there on; a cached block is reused only for its exact size.
  static constexpr size_t kSmallGranularity = 512;
  static constexpr size_t kLargeThreshold = size_t{1} << 20;
  static constexpr size_t kLargeGranularity = size_t{1} << 20;
  // Requests above this are refused as kResourceExhausted without asking the backend.
  static constexpr size_t kMaxRequest = size_t{1} << 56;

  explicit CachingAllocator(RawAllocator* raw);  // not owned
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // `bytes` must be > 0 (kInvalidArgument otherwise).
  absl::StatusOr<void*> Allocate(size_t bytes);
  // kInvalidArgument if `ptr` is not a block handed out by this allocator and still in use.
  absl::Status Free(void* ptr);
  // Returns every cached (free) block to the backend.
  void ReleaseCached();

  DeviceMemoryStats stats() const { return stats_; }
  static size_t RoundUp(size_t bytes);

 private:
  RawAllocator* raw_;
  absl::flat_hash_map<void*, size_t> in_use_;               // block -> rounded size
  absl::flat_hash_map<size_t, std::vector<void*>> cached_;  // rounded size -> free blocks
  DeviceMemoryStats stats_;
};

}  // namespace tandem
