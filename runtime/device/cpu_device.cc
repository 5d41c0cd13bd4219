#include "runtime/device/cpu_device.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/device/device_checks.h"

namespace tandem {

absl::StatusOr<void*> CpuDevice::HostAllocator::Allocate(size_t bytes) {
  // CachingAllocator sizes are multiples of 512, as aligned_alloc requires of the alignment.
  void* ptr = std::aligned_alloc(256, bytes);
  if (ptr == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host allocation of ", bytes, " bytes failed"));
  }
  return ptr;
}

void CpuDevice::HostAllocator::Free(void* ptr) { std::free(ptr); }

CpuDevice::CpuDevice() : pool_(&host_allocator_) {}

CpuDevice::~CpuDevice() = default;

absl::StatusOr<DeviceCapabilities> CpuDevice::Capabilities() {
  DeviceCapabilities caps;
  caps.name = "host";
  caps.kind = DeviceKind::kCpu;
  caps.ordinal = 0;
  const long page = sysconf(_SC_PAGESIZE);
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long available = sysconf(_SC_AVPHYS_PAGES);
  if (page <= 0 || pages <= 0 || available < 0) {
    return absl::InternalError("sysconf could not read the host's memory size");
  }
  caps.total_memory_bytes = static_cast<uint64_t>(page) * static_cast<uint64_t>(pages);
  caps.free_memory_bytes = static_cast<uint64_t>(page) * static_cast<uint64_t>(available);
  caps.multiprocessor_count = static_cast<int>(std::thread::hardware_concurrency());
  return caps;
}

absl::StatusOr<DeviceBuffer> CpuDevice::Allocate(size_t bytes) {
  ASSIGN_OR_RETURN(void* ptr, pool_.Allocate(bytes));
  return DeviceBuffer{ptr, bytes};
}

absl::Status CpuDevice::Free(DeviceBuffer buffer) { return pool_.Free(buffer.data); }

absl::StatusOr<Stream> CpuDevice::CreateStream() {
  const uint64_t id = next_id_++;
  streams_.insert(id);
  return Stream{id, nullptr};
}

absl::Status CpuDevice::DestroyStream(Stream stream) {
  RETURN_IF_ERROR(CheckStream(stream));
  streams_.erase(stream.id);
  return absl::OkStatus();
}

absl::Status CpuDevice::SynchronizeStream(Stream stream) { return CheckStream(stream); }

absl::Status CpuDevice::CheckStream(Stream stream) const {
  if (!streams_.contains(stream.id)) {
    return absl::InvalidArgumentError(absl::StrCat("unknown stream ", stream.id, " on cpu"));
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyHostToDevice(const void* src, size_t bytes, const DeviceBuffer& dst,
                                         size_t dst_offset, Stream stream) {
  RETURN_IF_ERROR(CheckStream(stream));
  RETURN_IF_ERROR(CheckBufferRange(dst, dst_offset, bytes, "destination"));
  if (bytes == 0) return absl::OkStatus();
  if (src == nullptr) return absl::InvalidArgumentError("host source is null");
  std::memcpy(static_cast<char*>(dst.data) + dst_offset, src, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyDeviceToHost(const DeviceBuffer& src, size_t src_offset, size_t bytes,
                                         void* dst, Stream stream) {
  RETURN_IF_ERROR(CheckStream(stream));
  RETURN_IF_ERROR(CheckBufferRange(src, src_offset, bytes, "source"));
  if (bytes == 0) return absl::OkStatus();
  if (dst == nullptr) return absl::InvalidArgumentError("host destination is null");
  std::memcpy(dst, static_cast<const char*>(src.data) + src_offset, bytes);
  return absl::OkStatus();
}

absl::Status CpuDevice::CopyDeviceToDevice(const DeviceBuffer& src, size_t src_offset,
                                           const DeviceBuffer& dst, size_t dst_offset, size_t bytes,
                                           Stream stream) {
  RETURN_IF_ERROR(CheckStream(stream));
  RETURN_IF_ERROR(CheckBufferRange(src, src_offset, bytes, "source"));
  RETURN_IF_ERROR(CheckBufferRange(dst, dst_offset, bytes, "destination"));
  if (bytes == 0) return absl::OkStatus();
  // memmove: a copy within one buffer may overlap, as cudaMemcpy's device copies allow.
  std::memmove(static_cast<char*>(dst.data) + dst_offset,
               static_cast<const char*>(src.data) + src_offset, bytes);
  return absl::OkStatus();
}

absl::StatusOr<Event> CpuDevice::CreateEvent() {
  const uint64_t id = next_id_++;
  events_.emplace(id, -1);
  return Event{id, nullptr};
}

absl::Status CpuDevice::DestroyEvent(Event event) {
  if (events_.erase(event.id) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown event ", event.id, " on cpu"));
  }
  return absl::OkStatus();
}

absl::Status CpuDevice::RecordEvent(Event event, Stream stream) {
  RETURN_IF_ERROR(CheckStream(stream));
  auto it = events_.find(event.id);
  if (it == events_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown event ", event.id, " on cpu"));
  }
  it->second = std::chrono::duration_cast<std::chrono::nanoseconds>(
                   std::chrono::steady_clock::now().time_since_epoch())
                   .count();
  return absl::OkStatus();
}

absl::StatusOr<float> CpuDevice::ElapsedMillis(Event start, Event end) {
  auto start_it = events_.find(start.id);
  auto end_it = events_.find(end.id);
  if (start_it == events_.end() || end_it == events_.end()) {
    return absl::InvalidArgumentError("unknown event on cpu");
  }
  if (start_it->second < 0 || end_it->second < 0) {
    return absl::FailedPreconditionError("ElapsedMillis on an event that was never recorded");
  }
  return static_cast<float>(static_cast<double>(end_it->second - start_it->second) * 1e-6);
}

}  // namespace tandem
