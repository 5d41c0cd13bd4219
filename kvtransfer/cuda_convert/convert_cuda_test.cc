// The GPU conversion kernel against the CPU routine (kv_convert.h), bit for bit, over every pair
// of block sizes in {8, 16, 32, 64}, both dtypes on each side and full and partial head ranges,
// with scattered block ids and a cached prefix; untouched destination bytes must survive.
// Skipped without a GPU (label gpu).
#include <cuda_runtime_api.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kvtransfer/cuda_convert/convert_on_device.h"
#include "kvtransfer/kv_convert.h"
#include "runtime/base/float16.h"

namespace tandem::kvtransfer::cuda_convert {
namespace {

KvLayout MakeLayout(int blocks, int block_size, KvDtype dtype, int head_begin, int heads) {
  KvLayout l;
  l.num_layers = 3;
  l.num_blocks = blocks;
  l.block_size = block_size;
  l.num_kv_heads = heads;
  l.head_dim = 8;
  l.dtype = dtype;
  l.elem_bytes = KvDtypeBytes(dtype);
  l.head_begin = head_begin;
  l.total_kv_heads = 4;
  l.block_bytes = static_cast<uint64_t>(block_size) * heads * l.head_dim * l.elem_bytes;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_stride * blocks;
  l.layer_stride = l.kv_stride * 2;
  return l;
}

uint64_t RegionBytes(const KvLayout& l) { return l.layer_stride * l.num_layers; }

class ConvertCudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
      GTEST_SKIP() << "no CUDA GPU";
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(ConvertCudaTest, KernelEqualsTheCpuRoutineForEveryFormatPair) {
  const int sizes[] = {8, 16, 32, 64};
  const KvDtype dtypes[] = {KvDtype::kF32, KvDtype::kBf16};
  const int heads[][4] = {{0, 4, 0, 4}, {0, 4, 1, 2}, {2, 2, 0, 4}, {0, 3, 1, 3}};
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  int cases = 0;
  for (int bs : sizes) {
    for (int bd : sizes) {
      for (KvDtype ts : dtypes) {
        for (KvDtype td : dtypes) {
          for (const auto& h : heads) {
            const int tokens = 150;
            const int skip = 40;
            const int sn = (tokens + bs - 1) / bs, dn = (tokens + bd - 1) / bd;
            const KvLayout src = MakeLayout(sn + 2, bs, ts, h[0], h[1]);
            const KvLayout dst = MakeLayout(dn + 3, bd, td, h[2], h[3]);
            std::vector<int32_t> sb(src.num_blocks), db(dst.num_blocks);
            std::iota(sb.begin(), sb.end(), 0);
            std::iota(db.begin(), db.end(), 0);
            std::shuffle(sb.begin(), sb.end(), rng);
            std::shuffle(db.begin(), db.end(), rng);
            sb.resize(sn);
            db.resize(dn);
            std::vector<char> in(RegionBytes(src)), canary(RegionBytes(dst));
            for (size_t i = 0; i + 4 <= in.size(); i += src.elem_bytes) {
              const float f = (i / src.elem_bytes) % 13 == 0 ? 1.0f + 0x1p-8f : normal(rng);
              if (ts == KvDtype::kF32) {
                std::memcpy(&in[i], &f, 4);
              } else {
                const uint16_t b = FloatToBf16(f);
                std::memcpy(&in[i], &b, 2);
              }
            }
            for (char& c : canary) c = static_cast<char>(rng());
            const std::string what =
                absl::StrCat(bs, "->", bd, " ", KvDtypeName(ts), "->", KvDtypeName(td), " heads ",
                             h[0], "+", h[1], "->", h[2], "+", h[3]);
            auto plan = PlanKvConversion(src, dst, sb, db, tokens, skip, 0, src.num_layers);
            ASSERT_TRUE(plan.ok()) << what << ": " << plan.status();
            std::vector<char> want = canary;
            ASSERT_TRUE(ConvertOnHost(*plan, in.data(), in.size(), want.data(), want.size()).ok());

            void* d_src = nullptr;
            void* d_dst = nullptr;
            ASSERT_EQ(cudaMalloc(&d_src, in.size()), cudaSuccess);
            ASSERT_EQ(cudaMalloc(&d_dst, canary.size()), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(d_src, in.data(), in.size(), cudaMemcpyHostToDevice), cudaSuccess);
            ASSERT_EQ(cudaMemcpy(d_dst, canary.data(), canary.size(), cudaMemcpyHostToDevice),
                      cudaSuccess);
            const absl::Status s =
                ConvertOnDevice(*plan, d_src, in.size(), d_dst, canary.size(), stream_);
            ASSERT_TRUE(s.ok()) << what << ": " << s;
            std::vector<char> got(canary.size());
            ASSERT_EQ(cudaMemcpy(got.data(), d_dst, got.size(), cudaMemcpyDeviceToHost),
                      cudaSuccess);
            cudaFree(d_src);
            cudaFree(d_dst);
            ASSERT_TRUE(got == want) << what;
            ++cases;
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 4 * 4 * 2 * 2 * 4);
}

TEST_F(ConvertCudaTest, RefusesPiecesOutsideTheBuffersWithoutLaunching) {
  const KvLayout l = MakeLayout(4, 16, KvDtype::kBf16, 0, 4);
  const std::vector<int32_t> ids = {3};
  auto plan = PlanKvConversion(l, l, ids, ids, 16, 0, 0, l.num_layers);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(
      ConvertOnDevice(*plan, nullptr, RegionBytes(l) - 1, nullptr, RegionBytes(l), stream_).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::kvtransfer::cuda_convert
