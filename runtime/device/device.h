#pragma once
// Device: the one interface between Tandem and a compute device (host memory, a CUDA GPU).
//
// Threading: one thread owns a Device (the engine thread) and makes every call on it; no method is
// thread-safe. A Device may be created on one thread and handed over before its first use.
//
// Ownership: the Device owns every buffer, stream and event it hands out; the handles below are
// plain values that name them. Destroying the Device waits for its streams, then releases all of
// them; handles outlive it only as dangling names.
//
// Asynchrony: copies are queued on a Stream and run in order on it. Host memory given to a copy
// must stay valid and unchanged (for host->device) or unread (for device->host) until the stream
// is synchronized. Work on different streams is unordered unless synchronized by the caller.
//
// Failure: a call that returns an error changed nothing (no buffer allocated, no copy queued),
// except when the error comes from earlier asynchronous work surfacing at a Synchronize: that is
// reported as kInternal with the backend's message, and a device that reported it should be
// destroyed (CUDA errors of that kind are sticky).

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

enum class DeviceKind { kCpu, kCuda };

std::string_view DeviceKindName(DeviceKind kind);

// What a device is and has, read when asked (free memory changes).
struct DeviceCapabilities {
  std::string name;  // the product name: "NVIDIA H200", "host"
  DeviceKind kind = DeviceKind::kCpu;
  int ordinal = 0;                   // N in "cuda:N"; 0 for the CPU
  uint64_t total_memory_bytes = 0;   // physical memory of the device
  uint64_t free_memory_bytes = 0;    // free now; memory this Device caches counts as used
  int compute_capability_major = 0;  // 9 for Hopper; 0 for the CPU
  int compute_capability_minor = 0;
  int multiprocessor_count = 0;  // SMs; hardware threads for the CPU
};

// A block of device memory. `data` is a device address (a host address for the CPU device); it is
// aligned to at least 256 bytes. Only the Device that returned it may use or free it.
struct DeviceBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

// An in-order queue of device work. `native` is the backend's handle (a cudaStream_t for CUDA,
// null for the CPU, whose work runs at the call); pass it to kernel launchers.
struct Stream {
  uint64_t id = 0;  // 0 is never a valid stream
  void* native = nullptr;
};

// A timing marker recorded on a stream.
struct Event {
  uint64_t id = 0;  // 0 is never a valid event
  void* native = nullptr;
};

// Bytes held by the device's memory pool, for metrics and for tests of the no-malloc step path.
struct DeviceMemoryStats {
  uint64_t bytes_in_use = 0;  // handed out and not freed (rounded to the pool's size classes)
  uint64_t bytes_cached = 0;  // freed to the pool, kept for reuse
  uint64_t backend_allocations = 0;  // calls to the backend allocator (cudaMalloc) so far
  uint64_t backend_frees = 0;        // calls to the backend deallocator so far
};

class Device {
 public:
  virtual ~Device() = default;

  // "cpu", "cuda:0": the name CreateDevice() accepts for this device.
  virtual std::string_view name() const = 0;
  virtual DeviceKind kind() const = 0;
  virtual absl::StatusOr<DeviceCapabilities> Capabilities() = 0;
  virtual DeviceMemoryStats MemoryStats() const = 0;

  // Memory. Allocate returns kInvalidArgument for 0 bytes and kResourceExhausted when the device is
  // out of memory. Freed memory is cached for reuse by later allocations (no backend call on a
  // steady-state step); the caller must ensure no queued work still uses a buffer it frees.
  // Free of a buffer this device did not hand out (or freed twice) is kInvalidArgument.
  virtual absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual absl::Status Free(DeviceBuffer buffer) = 0;

  // Streams.
  virtual absl::StatusOr<Stream> CreateStream() = 0;
  virtual absl::Status DestroyStream(Stream stream) = 0;      // waits for its work first
  virtual absl::Status SynchronizeStream(Stream stream) = 0;  // waits for its work

  // Copies, queued on `stream`. Ranges are checked against the buffers' sizes (kOutOfRange); an
  // unknown stream is kInvalidArgument. Zero-byte copies are no-ops.
  virtual absl::Status CopyHostToDevice(const void* src, size_t bytes, const DeviceBuffer& dst,
                                        size_t dst_offset, Stream stream) = 0;
  virtual absl::Status CopyDeviceToHost(const DeviceBuffer& src, size_t src_offset, size_t bytes,
                                        void* dst, Stream stream) = 0;
  virtual absl::Status CopyDeviceToDevice(const DeviceBuffer& src, size_t src_offset,
                                          const DeviceBuffer& dst, size_t dst_offset, size_t bytes,
                                          Stream stream) = 0;

  // Events for timing. ElapsedMillis needs both events recorded and completed (it waits for `end`).
  virtual absl::StatusOr<Event> CreateEvent() = 0;
  virtual absl::Status DestroyEvent(Event event) = 0;
  virtual absl::Status RecordEvent(Event event, Stream stream) = 0;
  virtual absl::StatusOr<float> ElapsedMillis(Event start, Event end) = 0;
};

}  // namespace tandem
