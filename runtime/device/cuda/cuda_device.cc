#include "runtime/device/cuda/cuda_device.h"

#include <cuda_runtime_api.h>

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/caching_allocator.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/device/device_checks.h"

namespace tandem {
namespace {

class CudaRawAllocator : public RawAllocator {
 public:
  explicit CudaRawAllocator(int ordinal) : ordinal_(ordinal) {}

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(ordinal_), "cudaSetDevice");
    void* ptr = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&ptr, bytes), absl::StrCat("cudaMalloc(", bytes, ")"));
    return ptr;
  }

  void Free(void* ptr) override {
    absl::Status status = CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice");
    if (status.ok()) status = CudaStatus(cudaFree(ptr), "cudaFree");
    if (!status.ok()) LOG(WARNING) << "cuda:" << ordinal_ << " " << status;
  }

 private:
  int ordinal_;
};

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal)
      : ordinal_(ordinal), name_(absl::StrCat("cuda:", ordinal)), raw_(ordinal), pool_(&raw_) {}

  ~CudaDevice() override {
    // Everything queued must finish before its memory goes back (pool_'s destructor, after this).
    absl::Status status = Bind();
    if (status.ok()) status = CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    for (const auto& [id, event] : events_) {
      if (status.ok()) status = CudaStatus(cudaEventDestroy(event), "cudaEventDestroy");
    }
    for (const auto& [id, stream] : streams_) {
      if (status.ok()) status = CudaStatus(cudaStreamDestroy(stream), "cudaStreamDestroy");
    }
    if (!status.ok()) LOG(WARNING) << name_ << " teardown: " << status;
  }

  absl::Status Init() {
    RETURN_IF_ERROR(Bind());
    cudaDeviceProp prop;
    RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, ordinal_), "cudaGetDeviceProperties");
    product_name_ = prop.name;
    cc_major_ = prop.major;
    cc_minor_ = prop.minor;
    sm_count_ = prop.multiProcessorCount;
    return absl::OkStatus();
  }

  std::string_view name() const override { return name_; }
  DeviceKind kind() const override { return DeviceKind::kCuda; }

  absl::StatusOr<DeviceCapabilities> Capabilities() override {
    RETURN_IF_ERROR(Bind());
    size_t free_bytes = 0;
    size_t total_bytes = 0;
    RETURN_IF_CUDA_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
    DeviceCapabilities caps;
    caps.name = product_name_;
    caps.kind = DeviceKind::kCuda;
    caps.ordinal = ordinal_;
    caps.total_memory_bytes = total_bytes;
    caps.free_memory_bytes = free_bytes;
    caps.compute_capability_major = cc_major_;
    caps.compute_capability_minor = cc_minor_;
    caps.multiprocessor_count = sm_count_;
    return caps;
  }

  DeviceMemoryStats MemoryStats() const override { return pool_.stats(); }

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) override {
    ASSIGN_OR_RETURN(void* ptr, pool_.Allocate(bytes));
    return DeviceBuffer{ptr, bytes};
  }

  absl::Status Free(DeviceBuffer buffer) override { return pool_.Free(buffer.data); }

  absl::StatusOr<Stream> CreateStream() override {
    RETURN_IF_ERROR(Bind());
    cudaStream_t stream = nullptr;
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                         "cudaStreamCreateWithFlags");
    const uint64_t id = next_id_++;
    streams_.emplace(id, stream);
    return Stream{id, stream};
  }

  absl::Status DestroyStream(Stream stream) override {
    ASSIGN_OR_RETURN(cudaStream_t native, Lookup(stream));
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(native), "cudaStreamSynchronize");
    RETURN_IF_CUDA_ERROR(cudaStreamDestroy(native), "cudaStreamDestroy");
    streams_.erase(stream.id);
    return absl::OkStatus();
  }

  absl::Status SynchronizeStream(Stream stream) override {
    ASSIGN_OR_RETURN(cudaStream_t native, Lookup(stream));
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(native), "cudaStreamSynchronize");
    return absl::OkStatus();
  }

  absl::Status CopyHostToDevice(const void* src, size_t bytes, const DeviceBuffer& dst,
                                size_t dst_offset, Stream stream) override {
    ASSIGN_OR_RETURN(cudaStream_t native, Lookup(stream));
    RETURN_IF_ERROR(CheckBufferRange(dst, dst_offset, bytes, "destination"));
    if (bytes == 0) return absl::OkStatus();
    if (src == nullptr) return absl::InvalidArgumentError("host source is null");
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(static_cast<char*>(dst.data) + dst_offset, src, bytes,
                                         cudaMemcpyHostToDevice, native),
                         "cudaMemcpyAsync host->device");
    return absl::OkStatus();
  }

  absl::Status CopyDeviceToHost(const DeviceBuffer& src, size_t src_offset, size_t bytes, void* dst,
                                Stream stream) override {
    ASSIGN_OR_RETURN(cudaStream_t native, Lookup(stream));
    RETURN_IF_ERROR(CheckBufferRange(src, src_offset, bytes, "source"));
    if (bytes == 0) return absl::OkStatus();
    if (dst == nullptr) return absl::InvalidArgumentError("host destination is null");
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, static_cast<const char*>(src.data) + src_offset,
                                         bytes, cudaMemcpyDeviceToHost, native),
                         "cudaMemcpyAsync device->host");
    return absl::OkStatus();
  }

  absl::Status CopyDeviceToDevice(const DeviceBuffer& src, size_t src_offset,
                                  const DeviceBuffer& dst, size_t dst_offset, size_t bytes,
                                  Stream stream) override {
    ASSIGN_OR_RETURN(cudaStream_t native, Lookup(stream));
    RETURN_IF_ERROR(CheckBufferRange(src, src_offset, bytes, "source"));
    RETURN_IF_ERROR(CheckBufferRange(dst, dst_offset, bytes, "destination"));
    if (bytes == 0) return absl::OkStatus();
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(static_cast<char*>(dst.data) + dst_offset,
                                         static_cast<const char*>(src.data) + src_offset, bytes,
                                         cudaMemcpyDeviceToDevice, native),
                         "cudaMemcpyAsync device->device");
    return absl::OkStatus();
  }

  absl::StatusOr<Event> CreateEvent() override {
    RETURN_IF_ERROR(Bind());
    cudaEvent_t event = nullptr;
    RETURN_IF_CUDA_ERROR(cudaEventCreate(&event), "cudaEventCreate");
    const uint64_t id = next_id_++;
    events_.emplace(id, event);
    return Event{id, event};
  }

  absl::Status DestroyEvent(Event event) override {
    ASSIGN_OR_RETURN(cudaEvent_t native, Lookup(event));
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaEventDestroy(native), "cudaEventDestroy");
    events_.erase(event.id);
    recorded_.erase(event.id);
    return absl::OkStatus();
  }

  absl::Status RecordEvent(Event event, Stream stream) override {
    ASSIGN_OR_RETURN(cudaEvent_t native_event, Lookup(event));
    ASSIGN_OR_RETURN(cudaStream_t native_stream, Lookup(stream));
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaEventRecord(native_event, native_stream), "cudaEventRecord");
    recorded_[event.id] = true;
    return absl::OkStatus();
  }

  absl::StatusOr<float> ElapsedMillis(Event start, Event end) override {
    ASSIGN_OR_RETURN(cudaEvent_t native_start, Lookup(start));
    ASSIGN_OR_RETURN(cudaEvent_t native_end, Lookup(end));
    if (!recorded_[start.id] || !recorded_[end.id]) {
      return absl::FailedPreconditionError("ElapsedMillis on an event that was never recorded");
    }
    RETURN_IF_ERROR(Bind());
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(native_end), "cudaEventSynchronize");
    float ms = 0.0f;
    RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, native_start, native_end),
                         "cudaEventElapsedTime");
    return ms;
  }

 private:
  absl::Status Bind() const { return CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice"); }

  absl::StatusOr<cudaStream_t> Lookup(Stream stream) const {
    auto it = streams_.find(stream.id);
    if (it == streams_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown stream ", stream.id, " on ", name_));
    }
    return it->second;
  }

  absl::StatusOr<cudaEvent_t> Lookup(Event event) const {
    auto it = events_.find(event.id);
    if (it == events_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown event ", event.id, " on ", name_));
    }
    return it->second;
  }

  const int ordinal_;
  const std::string name_;
  std::string product_name_;
  int cc_major_ = 0;
  int cc_minor_ = 0;
  int sm_count_ = 0;
  CudaRawAllocator raw_;
  CachingAllocator pool_;  // after raw_: destroyed first
  uint64_t next_id_ = 1;
  absl::flat_hash_map<uint64_t, cudaStream_t> streams_;
  absl::flat_hash_map<uint64_t, cudaEvent_t> events_;
  absl::flat_hash_map<uint64_t, bool> recorded_;  // event id -> recorded at least once
};

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    absl::Status status = CudaStatus(error, "cudaGetDeviceCount");
    if (absl::IsInternal(status)) status = absl::UnavailableError(status.message());
    return status;
  }
  return count;
}

absl::StatusOr<std::unique_ptr<Device>> CreateCudaDevice(int ordinal) {
  if (ordinal < 0) {
    return absl::InvalidArgumentError(absl::StrCat("negative CUDA device ordinal ", ordinal));
  }
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (count == 0) return absl::UnavailableError("no CUDA GPU is present (cudaGetDeviceCount = 0)");
  if (ordinal >= count) {
    return absl::NotFoundError(
        absl::StrCat("CUDA device ordinal ", ordinal, " requested, but ", count, " present"));
  }
  auto device = std::make_unique<CudaDevice>(ordinal);
  RETURN_IF_ERROR(device->Init());
  return std::unique_ptr<Device>(std::move(device));
}

}  // namespace tandem
