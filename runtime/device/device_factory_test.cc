#include "runtime/device/device_factory.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

TEST(DeviceFactoryTest, CreatesTheCpuDevice) {
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice("cpu");
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ((*device)->name(), "cpu");
  EXPECT_EQ((*device)->kind(), DeviceKind::kCpu);
  EXPECT_TRUE(DeviceBackendCompiledIn(DeviceKind::kCpu));
}

TEST(DeviceFactoryTest, RejectsMalformedNames) {
  for (const char* name : {"", "gpu", "CPU", "cpu:0", "cuda:", "cuda:x", "cuda:-1", "cuda:1x",
                           "cuda: 1", "cuda:99999999999999999999", "cuda0"}) {
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(name);
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument)
        << "\"" << name << "\": " << device.status();
  }
}

// Whatever this build and machine are, asking for CUDA gives a device or a clear error, never a
// crash: no backend -> kFailedPrecondition naming the build option; backend without a usable GPU
// -> kUnavailable; a GPU -> a device.
TEST(DeviceFactoryTest, CudaIsADeviceOrAClearError) {
  for (const char* name : {"cuda", "cuda:0"}) {
    absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice(name);
    if (!DeviceBackendCompiledIn(DeviceKind::kCuda)) {
      EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition) << device.status();
      EXPECT_NE(device.status().message().find("TANDEM_CUDA"), std::string_view::npos)
          << device.status();
    } else if (device.ok()) {
      EXPECT_EQ((*device)->kind(), DeviceKind::kCuda);
      EXPECT_EQ((*device)->name(), "cuda:0");
    } else {
      EXPECT_EQ(device.status().code(), absl::StatusCode::kUnavailable) << device.status();
      EXPECT_FALSE(device.status().message().empty());
    }
  }
}

TEST(DeviceFactoryTest, CudaOrdinalFarPastAnyGpuIsNotADevice) {
  absl::StatusOr<std::unique_ptr<Device>> device = CreateDevice("cuda:4096");
  EXPECT_FALSE(device.ok());
  EXPECT_TRUE(absl::IsNotFound(device.status()) || absl::IsUnavailable(device.status()) ||
              absl::IsFailedPrecondition(device.status()))
      << device.status();
}

}  // namespace
}  // namespace tandem
