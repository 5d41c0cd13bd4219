#pragma once
// CpuDevice: the reference Device over host memory. Work runs synchronously inside each call, so
// streams only order nothing and SynchronizeStream returns at once; events read the host clock.
// Memory comes from a CachingAllocator over 256-byte-aligned host allocations, so the pool logic
// is the same one the CUDA device uses. Contract (threading, ownership, failure): see device.h.

#include <cstdint>
#include <string_view>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "runtime/device/caching_allocator.h"
#include "runtime/device/device.h"

namespace tandem {

class CpuDevice final : public Device {
 public:
  CpuDevice();
  ~CpuDevice() override;

  std::string_view name() const override { return "cpu"; }
  DeviceKind kind() const override { return DeviceKind::kCpu; }
  absl::StatusOr<DeviceCapabilities> Capabilities() override;
  DeviceMemoryStats MemoryStats() const override { return pool_.stats(); }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override;
  absl::Status Free(DeviceBuffer buffer) override;

  absl::StatusOr<Stream> CreateStream() override;
  absl::Status DestroyStream(Stream stream) override;
  absl::Status SynchronizeStream(Stream stream) override;

  absl::Status CopyHostToDevice(const void* src, size_t bytes, const DeviceBuffer& dst,
                                size_t dst_offset, Stream stream) override;
  absl::Status CopyDeviceToHost(const DeviceBuffer& src, size_t src_offset, size_t bytes, void* dst,
                                Stream stream) override;
  absl::Status CopyDeviceToDevice(const DeviceBuffer& src, size_t src_offset,
                                  const DeviceBuffer& dst, size_t dst_offset, size_t bytes,
                                  Stream stream) override;

  absl::StatusOr<Event> CreateEvent() override;
  absl::Status DestroyEvent(Event event) override;
  absl::Status RecordEvent(Event event, Stream stream) override;
  absl::StatusOr<float> ElapsedMillis(Event start, Event end) override;

 private:
  class HostAllocator : public RawAllocator {
   public:
    absl::StatusOr<void*> Allocate(size_t bytes) override;
    void Free(void* ptr) override;
  };

  absl::Status CheckStream(Stream stream) const;

  HostAllocator host_allocator_;
  CachingAllocator pool_;  // after host_allocator_: destroyed first
  uint64_t next_id_ = 1;
  absl::flat_hash_set<uint64_t> streams_;
  // Event id -> recorded time in ns of the steady clock, or -1 while not recorded.
  absl::flat_hash_map<uint64_t, int64_t> events_;
};

}  // namespace tandem
