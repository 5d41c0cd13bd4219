// The CUDA engine plan's parser: defaults, every key, bad values and unknown keys. Host only.

#include "runtime/model/cuda/cuda_tuning.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

namespace tandem {
namespace {

using EvictFirst = cuda::DecodeAttentionTuning::EvictFirst;
using Skinny = GemmTuning::Skinny;

CudaTuning Parse(const std::string& spec) {
  absl::StatusOr<CudaTuning> t = ParseCudaTuning(spec);
  EXPECT_TRUE(t.ok()) << spec << ": " << t.status();
  return t.ok() ? *t : CudaTuning{};
}

// The parse error of `spec`, which must fail with InvalidArgument.
std::string Error(const std::string& spec) {
  absl::StatusOr<CudaTuning> t = ParseCudaTuning(spec);
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument) << spec;
  return std::string(t.status().message());
}

TEST(CudaTuningTest, EmptySpecGivesTheMeasuredDefaults) {
  const CudaTuning t = Parse("");
  EXPECT_EQ(t, CudaTuning{});
  EXPECT_EQ(t.decode.split_target, 2048);
  EXPECT_EQ(t.decode.min_split_tokens, 256);
  EXPECT_EQ(t.decode.max_chain, cuda::kDecodeChainMax);
  EXPECT_EQ(t.decode.evict_first, EvictFirst::kAuto);
  EXPECT_EQ(t.gemm.skinny, Skinny::kAuto);
  EXPECT_EQ(t.gemm.skinny_max_rows, 0);
  EXPECT_EQ(t.gemm.skinny_qkv_max_rows, 0);
  EXPECT_EQ(t.gemm.skinny_gated_max_rows, 0);
  EXPECT_EQ(t.gemm.skinny_ctas_per_sm, 2);
  EXPECT_TRUE(t.gemm.cluster);
  EXPECT_EQ(t.gemm.cluster_min_rows, 33);
  EXPECT_EQ(t.gemm.cluster_max_rows, 64);
  EXPECT_TRUE(t.gemm.cluster_shapes.empty());
  EXPECT_EQ(t.gemm.cluster_min_fill, 0.9);
  EXPECT_EQ(t.gemm.cluster_max_tile, 64);
  EXPECT_EQ(t.gemm.cluster_stages, 0);
  EXPECT_EQ(t.gemm.autotune_candidates, 8);
  EXPECT_FALSE(t.gemm.autotune_splitk);
  EXPECT_FALSE(t.gemm.autotune_log);
  EXPECT_TRUE(ValidateCudaTuning(t).ok());
  EXPECT_EQ(FormatCudaTuning(t), "");
}

TEST(CudaTuningTest, DecodeKeys) {
  const CudaTuning t = Parse(
      "decode.split_target=4096,decode.min_split_tokens=64,decode.chain=2,"
      "decode.evict_first=off");
  EXPECT_EQ(t.decode.split_target, 4096);
  EXPECT_EQ(t.decode.min_split_tokens, 64);
  EXPECT_EQ(t.decode.max_chain, 2);
  EXPECT_EQ(t.decode.evict_first, EvictFirst::kNever);
  EXPECT_EQ(t.gemm, GemmTuning{});
  EXPECT_EQ(Parse("decode.evict_first=on").decode.evict_first, EvictFirst::kAlways);
  EXPECT_EQ(Parse("decode.evict_first=auto").decode.evict_first, EvictFirst::kAuto);
  EXPECT_EQ(Parse("decode.chain=0").decode.max_chain, 0);
  EXPECT_EQ(Parse("decode.split_target=32").decode.split_target, 32);
  EXPECT_EQ(Parse("decode.split_target=65536").decode.split_target, 65536);
  EXPECT_EQ(Parse("decode.min_split_tokens=4096").decode.min_split_tokens, 4096);
}

TEST(CudaTuningTest, SkinnyKeys) {
  const CudaTuning t = Parse(
      "skinny=on,skinny.max_rows=48,skinny.qkv_max_rows=64,skinny.gated_max_rows=2,"
      "skinny.ctas_per_sm=16");
  EXPECT_EQ(t.gemm.skinny, Skinny::kOn);
  EXPECT_EQ(t.gemm.skinny_max_rows, 48);
  EXPECT_EQ(t.gemm.skinny_qkv_max_rows, 64);
  EXPECT_EQ(t.gemm.skinny_gated_max_rows, 2);
  EXPECT_EQ(t.gemm.skinny_ctas_per_sm, 16);
  EXPECT_EQ(t.decode, cuda::DecodeAttentionTuning{});
  EXPECT_EQ(Parse("skinny=off").gemm.skinny, Skinny::kOff);
  EXPECT_EQ(Parse("skinny=auto").gemm.skinny, Skinny::kAuto);
  EXPECT_EQ(Parse("skinny.max_rows=0").gemm.skinny_max_rows, 0);
}

TEST(CudaTuningTest, ClusterKeys) {
  const CudaTuning t = Parse(
      "cluster=off,cluster.rows=1-64,cluster.shapes=4096x4096:4096x14336,cluster.min_fill=0,"
      "cluster.max_tile=256,cluster.stages=12");
  EXPECT_FALSE(t.gemm.cluster);
  EXPECT_EQ(t.gemm.cluster_min_rows, 1);
  EXPECT_EQ(t.gemm.cluster_max_rows, 64);
  const std::vector<std::pair<int, int>> shapes = {{4096, 4096}, {4096, 14336}};
  EXPECT_EQ(t.gemm.cluster_shapes, shapes);
  EXPECT_EQ(t.gemm.cluster_min_fill, 0.0);
  EXPECT_EQ(t.gemm.cluster_max_tile, 256);
  EXPECT_EQ(t.gemm.cluster_stages, 12);
  EXPECT_TRUE(Parse("cluster=on").gemm.cluster);
  EXPECT_EQ(Parse("cluster.min_fill=0.7").gemm.cluster_min_fill, 0.7);
  EXPECT_EQ(Parse("cluster.rows=40-40").gemm.cluster_min_rows, 40);
}

TEST(CudaTuningTest, AutotuneKeys) {
  const CudaTuning t = Parse("autotune.candidates=128,autotune.splitk=1,autotune.log=1");
  EXPECT_EQ(t.gemm.autotune_candidates, 128);
  EXPECT_TRUE(t.gemm.autotune_splitk);
  EXPECT_TRUE(t.gemm.autotune_log);
  EXPECT_FALSE(Parse("autotune.splitk=0").gemm.autotune_splitk);
}

TEST(CudaTuningTest, TheLastValueOfAKeyWins) {
  EXPECT_EQ(Parse("skinny=on,skinny=off").gemm.skinny, Skinny::kOff);
  const std::vector<std::pair<int, int>> one = {{8, 64}};
  EXPECT_EQ(Parse("cluster.shapes=1x64:2x64,cluster.shapes=8x64").gemm.cluster_shapes, one);
}

TEST(CudaTuningTest, BadValuesNameTheKeyAndWhatItTakes) {
  const std::vector<std::string> bad = {"decode.split_target=31",
                                        "decode.split_target=65537",
                                        "decode.split_target=x",
                                        "decode.split_target=",
                                        "decode.min_split_tokens=100",
                                        "decode.min_split_tokens=0",
                                        "decode.min_split_tokens=4160",
                                        "decode.chain=5",
                                        "decode.chain=-1",
                                        "decode.evict_first=1",
                                        "skinny=1",
                                        "skinny.max_rows=1",
                                        "skinny.max_rows=65",
                                        "skinny.qkv_max_rows=-2",
                                        "skinny.gated_max_rows=100",
                                        "skinny.ctas_per_sm=0",
                                        "skinny.ctas_per_sm=17",
                                        "cluster=1",
                                        "cluster=auto",
                                        "cluster.rows=0-64",
                                        "cluster.rows=40-33",
                                        "cluster.rows=1-65",
                                        "cluster.rows=33",
                                        "cluster.rows=1-2-3",
                                        "cluster.shapes=4096",
                                        "cluster.shapes=0x64",
                                        "cluster.shapes=4096x",
                                        "cluster.shapes=",
                                        "cluster.min_fill=1.5",
                                        "cluster.min_fill=-0.1",
                                        "cluster.min_fill=nan",
                                        "cluster.max_tile=100",
                                        "cluster.max_tile=320",
                                        "cluster.stages=1",
                                        "cluster.stages=17",
                                        "autotune.candidates=0",
                                        "autotune.candidates=129",
                                        "autotune.splitk=yes",
                                        "autotune.log=2"};
  for (const std::string& spec : bad) {
    const std::string key = spec.substr(0, spec.find('='));
    const std::string message = Error(spec);
    EXPECT_NE(message.find(key + " takes "), std::string::npos) << spec << ": " << message;
    EXPECT_NE(message.find(spec.substr(spec.find('=') + 1)), std::string::npos)
        << spec << ": " << message;
  }
  // A bad item fails the whole spec, wherever it is.
  Error("skinny=on,decode.chain=9");
}

TEST(CudaTuningTest, UnknownKeysAndMalformedItemsListTheKeys) {
  for (const std::string& spec :
       {std::string("decode.split=4"), std::string("TANDEM_SKINNY_GEMM=1"), std::string("skinny"),
        std::string("skinny=on,"), std::string(",skinny=on"), std::string("=1")}) {
    const std::string message = Error(spec);
    EXPECT_NE(message.find("decode.split_target"), std::string::npos) << spec << ": " << message;
    EXPECT_NE(message.find("autotune.log"), std::string::npos) << spec << ": " << message;
  }
  EXPECT_NE(Error("decode.split=4").find("unknown CUDA tuning key \"decode.split\""),
            std::string::npos);
  // Every key is listed once per line.
  const std::string keys = CudaTuningKeys();
  for (const char* key :
       {"decode.split_target:", "decode.min_split_tokens:", "decode.chain:", "decode.evict_first:",
        "skinny:", "skinny.max_rows:", "skinny.qkv_max_rows:", "skinny.gated_max_rows:",
        "skinny.ctas_per_sm:", "cluster:", "cluster.rows:", "cluster.shapes:", "cluster.min_fill:",
        "cluster.max_tile:", "cluster.stages:", "autotune.candidates:", "autotune.splitk:",
        "autotune.log:"}) {
    EXPECT_TRUE(keys.find(key) == 0 || keys.find(std::string("\n") + key) != std::string::npos)
        << key << " in\n"
        << keys;
  }
}

TEST(CudaTuningTest, ValidateNamesTheFieldOfTuningFilledInCode) {
  CudaTuning t;
  t.gemm.skinny_ctas_per_sm = 0;
  absl::Status s = ValidateCudaTuning(t);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("skinny.ctas_per_sm takes"), std::string::npos) << s;
  t = CudaTuning{};
  t.decode.min_split_tokens = 100;
  s = ValidateCudaTuning(t);
  EXPECT_NE(s.message().find("decode.min_split_tokens takes"), std::string::npos) << s;
  t = CudaTuning{};
  t.gemm.cluster_shapes = {{64, -1}};
  s = ValidateCudaTuning(t);
  EXPECT_NE(s.message().find("cluster.shapes takes"), std::string::npos) << s;
  EXPECT_NE(s.message().find("64x-1"), std::string::npos) << s;
}

TEST(CudaTuningTest, FormatRoundTrips) {
  const std::vector<std::string> specs = {
      "decode.split_target=4096,decode.evict_first=on",
      "decode.min_split_tokens=64,decode.chain=0,skinny=on,skinny.max_rows=64",
      "skinny=off,skinny.qkv_max_rows=16,skinny.gated_max_rows=48,skinny.ctas_per_sm=3",
      "cluster=off,cluster.rows=1-64,cluster.shapes=6144x4096:4096x14336,cluster.min_fill=0.7",
      "cluster.max_tile=128,cluster.stages=8,autotune.candidates=32,autotune.splitk=1,"
      "autotune.log=1",
      "cluster.min_fill=0.123456789"};
  for (const std::string& spec : specs) {
    const CudaTuning t = Parse(spec);
    EXPECT_EQ(FormatCudaTuning(t), spec);
    EXPECT_EQ(Parse(FormatCudaTuning(t)), t) << spec;
  }
}

}  // namespace
}  // namespace tandem
