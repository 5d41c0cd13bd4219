// Tests of the CUDA Device through the Device interface. Skipped without a GPU.

#include "runtime/device/cuda/cuda_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "runtime/device/device_factory.h"

namespace tandem {
namespace {

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
    count_ = *count;
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice("cuda:0");
    ASSERT_TRUE(device.ok()) << device.status();
    device_ = std::move(*device);
    absl::StatusOr<Stream> stream = device_->CreateStream();
    ASSERT_TRUE(stream.ok()) << stream.status();
    stream_ = *stream;
  }

  std::vector<uint8_t> RandomBytes(size_t n) {
    std::mt19937_64 rng(std::random_device{}());
    std::vector<uint8_t> v(n);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }

  int count_ = 0;
  std::unique_ptr<Device> device_;
  Stream stream_;
};

TEST_F(CudaDeviceTest, ReportsCapabilities) {
  EXPECT_EQ(device_->name(), "cuda:0");
  EXPECT_EQ(device_->kind(), DeviceKind::kCuda);
  absl::StatusOr<DeviceCapabilities> caps = device_->Capabilities();
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_FALSE(caps->name.empty());
  EXPECT_GT(caps->total_memory_bytes, 0u);
  EXPECT_GT(caps->free_memory_bytes, 0u);
  EXPECT_LE(caps->free_memory_bytes, caps->total_memory_bytes);
  EXPECT_GE(caps->compute_capability_major, 7);
  EXPECT_GT(caps->multiprocessor_count, 0);
  std::printf("cuda:0 = %s, sm_%d%d, %d SMs, %.1f GiB total, %.1f GiB free\n", caps->name.c_str(),
              caps->compute_capability_major, caps->compute_capability_minor,
              caps->multiprocessor_count, caps->total_memory_bytes / 1073741824.0,
              caps->free_memory_bytes / 1073741824.0);
}

TEST_F(CudaDeviceTest, CopiesRoundTripWithOffsets) {
  const size_t n = (size_t{64} << 20) + 123;
  const std::vector<uint8_t> data = RandomBytes(n);
  absl::StatusOr<DeviceBuffer> a = device_->Allocate(n);
  absl::StatusOr<DeviceBuffer> b = device_->Allocate(n + 1000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 256, 0u);
  ASSERT_TRUE(device_->CopyHostToDevice(data.data(), n, *a, 0, stream_).ok());
  ASSERT_TRUE(device_->CopyDeviceToDevice(*a, 7, *b, 501, n - 7, stream_).ok());
  std::vector<uint8_t> back(n - 7, 0);
  ASSERT_TRUE(device_->CopyDeviceToHost(*b, 501, n - 7, back.data(), stream_).ok());
  ASSERT_TRUE(device_->SynchronizeStream(stream_).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin() + 7));
  EXPECT_TRUE(device_->Free(*a).ok());
  EXPECT_TRUE(device_->Free(*b).ok());
}

TEST_F(CudaDeviceTest, RejectsBadRangesAndHandles) {
  absl::StatusOr<DeviceBuffer> a = device_->Allocate(1024);
  ASSERT_TRUE(a.ok());
  std::vector<uint8_t> host(2048);
  EXPECT_EQ(device_->CopyHostToDevice(host.data(), 1025, *a, 0, stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_->CopyDeviceToHost(*a, 1000, 25, host.data(), stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_->CopyDeviceToDevice(*a, SIZE_MAX, *a, 0, 2, stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_->CopyHostToDevice(host.data(), 16, *a, 0, Stream{999, nullptr}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->Free(*a).ok());
  EXPECT_EQ(device_->Free(*a).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(CudaDeviceTest, PoolReusesFreedMemoryWithoutCudaMalloc) {
  const std::vector<size_t> sizes = {4096, 1 << 20, 3 << 20, 100, 777777};
  std::vector<DeviceBuffer> buffers;
  for (size_t s : sizes) {
    absl::StatusOr<DeviceBuffer> b = device_->Allocate(s);
    ASSERT_TRUE(b.ok()) << b.status();
    buffers.push_back(*b);
  }
  const DeviceMemoryStats warm = device_->MemoryStats();
  for (int step = 0; step < 10; ++step) {
    for (const DeviceBuffer& b : buffers) ASSERT_TRUE(device_->Free(b).ok());
    buffers.clear();
    for (size_t s : sizes) {
      absl::StatusOr<DeviceBuffer> b = device_->Allocate(s);
      ASSERT_TRUE(b.ok()) << b.status();
      buffers.push_back(*b);
    }
  }
  EXPECT_EQ(device_->MemoryStats().backend_allocations, warm.backend_allocations);
  EXPECT_EQ(device_->MemoryStats().bytes_in_use, warm.bytes_in_use);
  for (const DeviceBuffer& b : buffers) EXPECT_TRUE(device_->Free(b).ok());
}

TEST_F(CudaDeviceTest, OutOfMemoryIsAStatusAndDeviceStaysUsable) {
  absl::StatusOr<DeviceBuffer> huge = device_->Allocate(size_t{1} << 50);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  // The error must not be sticky: later work still runs.
  const std::vector<uint8_t> data = RandomBytes(4096);
  absl::StatusOr<DeviceBuffer> a = device_->Allocate(4096);
  ASSERT_TRUE(a.ok()) << a.status();
  std::vector<uint8_t> back(4096);
  ASSERT_TRUE(device_->CopyHostToDevice(data.data(), 4096, *a, 0, stream_).ok());
  ASSERT_TRUE(device_->CopyDeviceToHost(*a, 0, 4096, back.data(), stream_).ok());
  ASSERT_TRUE(device_->SynchronizeStream(stream_).ok());
  EXPECT_EQ(back, data);
  EXPECT_TRUE(device_->Free(*a).ok());
}

TEST_F(CudaDeviceTest, EventsTimeACopy) {
  const size_t n = size_t{256} << 20;
  absl::StatusOr<DeviceBuffer> a = device_->Allocate(n);
  absl::StatusOr<DeviceBuffer> b = device_->Allocate(n);
  ASSERT_TRUE(a.ok() && b.ok());
  absl::StatusOr<Event> start = device_->CreateEvent();
  absl::StatusOr<Event> end = device_->CreateEvent();
  ASSERT_TRUE(start.ok() && end.ok());
  EXPECT_EQ(device_->ElapsedMillis(*start, *end).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(device_->RecordEvent(*start, stream_).ok());
  ASSERT_TRUE(device_->CopyDeviceToDevice(*a, 0, *b, 0, n, stream_).ok());
  ASSERT_TRUE(device_->RecordEvent(*end, stream_).ok());
  absl::StatusOr<float> ms = device_->ElapsedMillis(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GT(*ms, 0.0f);
  std::printf("256 MiB device copy: %.3f ms (%.0f GB/s read+write)\n", *ms, 2.0 * n / (*ms * 1e6));
  EXPECT_TRUE(device_->DestroyEvent(*start).ok());
  EXPECT_TRUE(device_->DestroyEvent(*end).ok());
  EXPECT_EQ(device_->DestroyEvent(*end).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_->Free(*a).ok());
  EXPECT_TRUE(device_->Free(*b).ok());
}

TEST_F(CudaDeviceTest, FactoryRejectsOrdinalPastTheGpus) {
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice("cuda:" + std::to_string(count_));
  EXPECT_EQ(device.status().code(), absl::StatusCode::kNotFound) << device.status();
}

TEST_F(CudaDeviceTest, DestroyedStreamIsRejected) {
  absl::StatusOr<Stream> s = device_->CreateStream();
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(device_->DestroyStream(*s).ok());
  EXPECT_EQ(device_->SynchronizeStream(*s).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem
