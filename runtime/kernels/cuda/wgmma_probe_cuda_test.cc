// GPU test of the wgmma building blocks of the Hopper prefill attention (wgmma_probe.h): S = Q K^T
// and O = P V through the kernel's shared-memory layout, descriptors and fragment maps, against a
// float64 product of the same bf16 inputs. Skipped without a GPU, and on GPUs other than compute
// capability 9.0 (the code is sm_90a).

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/base/float16.h"
#include "runtime/kernels/cuda/cuda_kernel_test_util.h"
#include "runtime/kernels/cuda/wgmma_probe.h"

namespace tandem {
namespace {

using testing_util::CudaKernelTest;
using testing_util::FastRng;
using testing_util::RandomBf16;

class WgmmaProbeTest : public CudaKernelTest {};

TEST_F(WgmmaProbeTest, QkAndPvMatchTheCpu) {
  absl::StatusOr<DeviceCapabilities> caps = device_->Capabilities();
  ASSERT_TRUE(caps.ok()) << caps.status();
  if (caps->compute_capability_major != 9 || caps->compute_capability_minor != 0) {
    GTEST_SKIP() << "wgmma code is sm_90a; this GPU is " << caps->compute_capability_major << "."
                 << caps->compute_capability_minor;
  }
  FastRng rng(3);
  const std::vector<uint16_t> q = RandomBf16(64 * 128, 1.0f, rng),
                              k = RandomBf16(64 * 128, 1.0f, rng),
                              v = RandomBf16(64 * 128, 1.0f, rng),
                              p = RandomBf16(64 * 64, 0.1f, rng);
  const DeviceBuffer dq = Upload(q), dk = Upload(k), dv = Upload(v), dp = Upload(p);
  const DeviceBuffer ds = Upload(std::vector<float>(64 * 64, NAN));
  const DeviceBuffer d_o = Upload(std::vector<float>(64 * 128, NAN));
  ASSERT_EQ(cuda::internal::LaunchWgmmaProbeRaw(
                dq.data, dk.data, dv.data, dp.data, static_cast<float*>(ds.data),
                static_cast<float*>(d_o.data), static_cast<cudaStream_t>(stream())),
            cudaSuccess);
  const std::vector<float> s = Download<float>(ds, 64 * 64);
  const std::vector<float> o = Download<float>(d_o, 64 * 128);
  std::vector<float> s_ref(64 * 64), o_ref(64 * 128);
  for (int m = 0; m < 64; ++m) {
    for (int n = 0; n < 64; ++n) {
      double acc = 0;
      for (int d = 0; d < 128; ++d)
        acc += double{Bf16ToFloat(q[m * 128 + d])} * Bf16ToFloat(k[n * 128 + d]);
      s_ref[m * 64 + n] = static_cast<float>(acc);
    }
    for (int d = 0; d < 128; ++d) {
      double acc = 0;
      for (int key = 0; key < 64; ++key)
        acc += double{Bf16ToFloat(p[m * 64 + key])} * Bf16ToFloat(v[key * 128 + d]);
      o_ref[m * 128 + d] = static_cast<float>(acc);
    }
  }
  testing_util::ExpectClose(s, s_ref, 1e-3, 1e-4, 1e-5, "wgmma S = Q K^T");
  testing_util::ExpectClose(o, o_ref, 1e-3, 1e-4, 1e-5, "wgmma O = P V");
}

}  // namespace
}  // namespace tandem
