#include "runtime/device/cpu_device.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace tandem {
namespace {

std::vector<uint8_t> RandomBytes(size_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

class CpuDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<Stream> stream = device_.CreateStream();
    ASSERT_TRUE(stream.ok());
    stream_ = *stream;
  }
  CpuDevice device_;
  Stream stream_;
};

TEST_F(CpuDeviceTest, ReportsItself) {
  EXPECT_EQ(device_.name(), "cpu");
  EXPECT_EQ(device_.kind(), DeviceKind::kCpu);
  EXPECT_EQ(DeviceKindName(device_.kind()), "cpu");
  absl::StatusOr<DeviceCapabilities> caps = device_.Capabilities();
  ASSERT_TRUE(caps.ok()) << caps.status();
  EXPECT_EQ(caps->kind, DeviceKind::kCpu);
  EXPECT_GT(caps->total_memory_bytes, 0u);
  EXPECT_LE(caps->free_memory_bytes, caps->total_memory_bytes);
  EXPECT_EQ(caps->compute_capability_major, 0);
  EXPECT_GT(caps->multiprocessor_count, 0);
}

TEST_F(CpuDeviceTest, CopiesRoundTripWithOffsets) {
  const size_t n = 100003;
  const std::vector<uint8_t> data = RandomBytes(n);
  absl::StatusOr<DeviceBuffer> a = device_.Allocate(n);
  absl::StatusOr<DeviceBuffer> b = device_.Allocate(n + 64);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bytes, n);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % 256, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b->data) % 256, 0u);
  ASSERT_TRUE(device_.CopyHostToDevice(data.data(), n, *a, 0, stream_).ok());
  ASSERT_TRUE(device_.CopyDeviceToDevice(*a, 3, *b, 61, n - 3, stream_).ok());
  std::vector<uint8_t> back(n - 3);
  ASSERT_TRUE(device_.CopyDeviceToHost(*b, 61, n - 3, back.data(), stream_).ok());
  ASSERT_TRUE(device_.SynchronizeStream(stream_).ok());
  EXPECT_TRUE(std::equal(back.begin(), back.end(), data.begin() + 3));
  EXPECT_TRUE(device_.Free(*a).ok());
  EXPECT_TRUE(device_.Free(*b).ok());
}

TEST_F(CpuDeviceTest, OverlappingCopyWithinOneBuffer) {
  std::vector<uint8_t> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 7);
  absl::StatusOr<DeviceBuffer> a = device_.Allocate(data.size());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(device_.CopyHostToDevice(data.data(), data.size(), *a, 0, stream_).ok());
  ASSERT_TRUE(device_.CopyDeviceToDevice(*a, 0, *a, 10, 990, stream_).ok());
  std::vector<uint8_t> back(1000);
  ASSERT_TRUE(device_.CopyDeviceToHost(*a, 0, 1000, back.data(), stream_).ok());
  EXPECT_TRUE(std::equal(back.begin() + 10, back.end(), data.begin()));
  EXPECT_TRUE(device_.Free(*a).ok());
}

TEST_F(CpuDeviceTest, RejectsOutOfRangeCopies) {
  absl::StatusOr<DeviceBuffer> a = device_.Allocate(1024);
  ASSERT_TRUE(a.ok());
  std::vector<uint8_t> host(4096, 0xab);
  EXPECT_EQ(device_.CopyHostToDevice(host.data(), 1025, *a, 0, stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_.CopyHostToDevice(host.data(), 1, *a, 1024, stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_.CopyDeviceToHost(*a, SIZE_MAX, 2, host.data(), stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_.CopyDeviceToDevice(*a, 0, *a, 1, 1024, stream_).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ(device_.CopyHostToDevice(nullptr, 4, *a, 0, stream_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.CopyDeviceToHost(DeviceBuffer{}, 0, 4, host.data(), stream_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_.CopyHostToDevice(nullptr, 0, *a, 1024, stream_).ok()) << "0 bytes: no-op";
  EXPECT_TRUE(device_.Free(*a).ok());
}

TEST_F(CpuDeviceTest, RejectsUnknownStreams) {
  absl::StatusOr<DeviceBuffer> a = device_.Allocate(64);
  ASSERT_TRUE(a.ok());
  uint8_t host[64] = {};
  EXPECT_EQ(device_.CopyHostToDevice(host, 64, *a, 0, Stream{}).code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Stream> s = device_.CreateStream();
  ASSERT_TRUE(s.ok());
  EXPECT_NE(s->id, stream_.id);
  EXPECT_TRUE(device_.DestroyStream(*s).ok());
  EXPECT_EQ(device_.SynchronizeStream(*s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.DestroyStream(*s).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_.Free(*a).ok());
}

TEST_F(CpuDeviceTest, AllocationErrorsAreStatuses) {
  EXPECT_EQ(device_.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  // 1 PiB exceeds the x86-64 user address space, so the host allocator must refuse it.
  EXPECT_EQ(device_.Allocate(size_t{1} << 50).status().code(),
            absl::StatusCode::kResourceExhausted);
  absl::StatusOr<DeviceBuffer> a = device_.Allocate(10);
  ASSERT_TRUE(a.ok());
  EXPECT_TRUE(device_.Free(*a).ok());
  EXPECT_EQ(device_.Free(*a).code(), absl::StatusCode::kInvalidArgument);
  int not_ours = 0;
  EXPECT_EQ(device_.Free(DeviceBuffer{&not_ours, sizeof(not_ours)}).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CpuDeviceTest, PoolAvoidsBackendAllocationsOnRepeatedSteps) {
  for (int step = 0; step < 5; ++step) {
    absl::StatusOr<DeviceBuffer> a = device_.Allocate(4000);
    absl::StatusOr<DeviceBuffer> b = device_.Allocate(2 << 20);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_TRUE(device_.Free(*a).ok());
    EXPECT_TRUE(device_.Free(*b).ok());
  }
  const DeviceMemoryStats stats = device_.MemoryStats();
  EXPECT_EQ(stats.backend_allocations, 2u);
  EXPECT_EQ(stats.bytes_in_use, 0u);
  EXPECT_EQ(stats.bytes_cached, 4096u + (2u << 20));
}

TEST_F(CpuDeviceTest, EventsMeasureElapsedTime) {
  absl::StatusOr<Event> start = device_.CreateEvent();
  absl::StatusOr<Event> end = device_.CreateEvent();
  ASSERT_TRUE(start.ok() && end.ok());
  EXPECT_EQ(device_.ElapsedMillis(*start, *end).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(device_.RecordEvent(*start, stream_).ok());
  const std::vector<uint8_t> data = RandomBytes(1 << 20);
  absl::StatusOr<DeviceBuffer> a = device_.Allocate(data.size());
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(device_.CopyHostToDevice(data.data(), data.size(), *a, 0, stream_).ok());
  ASSERT_TRUE(device_.RecordEvent(*end, stream_).ok());
  absl::StatusOr<float> ms = device_.ElapsedMillis(*start, *end);
  ASSERT_TRUE(ms.ok()) << ms.status();
  EXPECT_GE(*ms, 0.0f);
  EXPECT_TRUE(device_.DestroyEvent(*start).ok());
  EXPECT_EQ(device_.DestroyEvent(*start).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(device_.RecordEvent(*start, stream_).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(device_.Free(*a).ok());
}

}  // namespace
}  // namespace tandem
