// KvHostMirror on a GPU: blocks staged device -> mirror and mirror -> device arrive byte for byte
// and nothing else changes, for the CUDA runner's layout. Skipped without a GPU.
#include "runtime/model/cuda/kv_host_mirror.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "runtime/device/cuda/cuda_device.h"

namespace tandem {
namespace {

class KvHostMirrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) GTEST_SKIP() << "no usable CUDA GPU: " << count.status();
    if (*count == 0) GTEST_SKIP() << "no CUDA GPU present (cudaGetDeviceCount = 0)";
    // [layers 3, K/V, blocks 12, 16 tokens x 2 heads x 8 dims x 2 bytes]
    l_.num_layers = 3;
    l_.num_blocks = 12;
    l_.block_size = 16;
    l_.num_kv_heads = 2;
    l_.head_dim = 8;
    l_.elem_bytes = 2;
    l_.block_bytes = 16 * 2 * 8 * 2;
    l_.block_stride = l_.block_bytes;
    l_.kv_stride = l_.block_stride * l_.num_blocks;
    l_.layer_stride = 2 * l_.kv_stride;
    l_.bytes = l_.layer_stride * l_.num_layers;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&l_.base, l_.bytes), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (l_.base != nullptr) cudaFree(l_.base);
  }
  std::vector<uint8_t> Download() {
    std::vector<uint8_t> out(l_.bytes);
    EXPECT_EQ(cudaMemcpy(out.data(), l_.base, l_.bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }
  // Copies of `blocks` (every layer, K and V) from `src` into `dst`.
  void CopyBlocks(const std::vector<int32_t>& blocks, const uint8_t* src, uint8_t* dst) {
    for (int32_t b : blocks) {
      for (int layer = 0; layer < l_.num_layers; ++layer) {
        for (int kv = 0; kv < 2; ++kv) {
          const size_t at = l_.Offset(layer, kv, b);
          std::memcpy(dst + at, src + at, l_.block_bytes);
        }
      }
    }
  }
  KvCacheLayout l_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(KvHostMirrorTest, StagesExactlyTheBlocksBothWays) {
  std::vector<uint8_t> device(l_.bytes);
  for (size_t i = 0; i < device.size(); ++i) device[i] = static_cast<uint8_t>(i * 7 + 3);
  ASSERT_EQ(cudaMemcpy(l_.base, device.data(), l_.bytes, cudaMemcpyHostToDevice), cudaSuccess);

  KvHostMirror mirror;
  auto layout = mirror.Layout(l_, 0);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_NE(layout->base, l_.base);
  EXPECT_EQ(layout->bytes, l_.bytes);
  EXPECT_EQ(layout->kv_stride, l_.kv_stride);
  EXPECT_EQ(mirror.Layout(l_, 0)->base, layout->base);  // allocated once
  uint8_t* host = static_cast<uint8_t*>(layout->base);
  std::memset(host, 0, l_.bytes);

  // Device -> mirror: runs {1, 2, 3}, {7}, {10, 11}.
  const std::vector<int32_t> out_blocks = {7, 1, 2, 3, 10, 11};
  ASSERT_TRUE(mirror.Stage(out_blocks, KvStage::kToMirror, stream_).ok());
  std::vector<uint8_t> want(l_.bytes, 0);
  CopyBlocks(out_blocks, device.data(), want.data());
  EXPECT_TRUE(std::memcmp(host, want.data(), l_.bytes) == 0) << "mirror differs";

  // Mirror -> device: new bytes in blocks {0, 5, 6}; the rest of the device cache stays.
  for (size_t i = 0; i < l_.bytes; ++i) host[i] = static_cast<uint8_t>(255 - i % 251);
  const std::vector<int32_t> in_blocks = {6, 0, 5};
  ASSERT_TRUE(mirror.Stage(in_blocks, KvStage::kFromMirror, stream_).ok());
  std::vector<uint8_t> want_device = device;
  CopyBlocks(in_blocks, host, want_device.data());
  EXPECT_TRUE(Download() == want_device) << "device cache differs";

  // A bad id copies nothing.
  const std::vector<int32_t> bad = {0, 12};
  const absl::Status s = mirror.Stage(bad, KvStage::kFromMirror, stream_);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Download() == want_device);
}

}  // namespace
}  // namespace tandem
