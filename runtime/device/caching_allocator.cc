#include "runtime/device/caching_allocator.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem {

CachingAllocator::CachingAllocator(RawAllocator* raw) : raw_(raw) {}

CachingAllocator::~CachingAllocator() {
  ReleaseCached();
  for (const auto& [ptr, size] : in_use_) raw_->Free(ptr);
}

size_t CachingAllocator::RoundUp(size_t bytes) {
  const size_t granularity = bytes < kLargeThreshold ? kSmallGranularity : kLargeGranularity;
  return (bytes + granularity - 1) / granularity * granularity;
}

absl::StatusOr<void*> CachingAllocator::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("device allocation of 0 bytes");
  if (bytes > kMaxRequest) {
    return absl::ResourceExhaustedError(
        absl::StrCat("device allocation of ", bytes, " bytes exceeds any device"));
  }
  const size_t rounded = RoundUp(bytes);
  void* ptr = nullptr;
  auto it = cached_.find(rounded);
  if (it != cached_.end() && !it->second.empty()) {
    ptr = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= rounded;
  } else {
    absl::StatusOr<void*> fresh = raw_->Allocate(rounded);
    ++stats_.backend_allocations;
    if (!fresh.ok() && absl::IsResourceExhausted(fresh.status()) && stats_.bytes_cached > 0) {
      ReleaseCached();
      fresh = raw_->Allocate(rounded);
      ++stats_.backend_allocations;
    }
    if (!fresh.ok()) return fresh.status();
    ptr = *fresh;
  }
  in_use_.emplace(ptr, rounded);
  stats_.bytes_in_use += rounded;
  return ptr;
}

absl::Status CachingAllocator::Free(void* ptr) {
  auto it = in_use_.find(ptr);
  if (it == in_use_.end()) {
    return absl::InvalidArgumentError(
        "freeing a buffer this device did not allocate, or already freed");
  }
  const size_t rounded = it->second;
  in_use_.erase(it);
  cached_[rounded].push_back(ptr);
  stats_.bytes_in_use -= rounded;
  stats_.bytes_cached += rounded;
  return absl::OkStatus();
}

void CachingAllocator::ReleaseCached() {
  for (auto& [size, blocks] : cached_) {
    for (void* ptr : blocks) {
      raw_->Free(ptr);
      ++stats_.backend_frees;
    }
  }
  cached_.clear();
  stats_.bytes_cached = 0;
}

}  // namespace tandem
