#include "runtime/model/weights.h"

#include <cstring>
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A 2-layer model small enough to list by hand: hidden 4, 2 heads of dim 2 (q_dim 4), 1 kv
// head (kv_dim 2), intermediate 6, vocab 5.
ModelConfig SmallConfig(bool bias, bool tied) {
  ModelConfig c;
  c.architecture = bias ? ModelArchitecture::kQwen2 : ModelArchitecture::kLlama;
  c.vocab_size = 5;
  c.hidden_size = 4;
  c.intermediate_size = 6;
  c.num_layers = 2;
  c.num_heads = 2;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.attention_bias = bias;
  c.tie_word_embeddings = tied;
  return c;
}

// Expected HF tensors (name -> shape) for SmallConfig, written out by hand.
std::map<std::string, std::vector<int64_t>> ExpectedTensors(bool bias, bool tied) {
  std::map<std::string, std::vector<int64_t>> t = {{"model.embed_tokens.weight", {5, 4}},
                                                   {"model.norm.weight", {4}}};
  for (const std::string l : {"0", "1"}) {
    const std::string p = "model.layers." + l + ".";
    t[p + "input_layernorm.weight"] = {4};
    t[p + "post_attention_layernorm.weight"] = {4};
    t[p + "self_attn.q_proj.weight"] = {4, 4};
    t[p + "self_attn.k_proj.weight"] = {2, 4};
    t[p + "self_attn.v_proj.weight"] = {2, 4};
    t[p + "self_attn.o_proj.weight"] = {4, 4};
    t[p + "mlp.gate_proj.weight"] = {6, 4};
    t[p + "mlp.up_proj.weight"] = {6, 4};
    t[p + "mlp.down_proj.weight"] = {4, 6};
    if (bias) {
      t[p + "self_attn.q_proj.bias"] = {4};
      t[p + "self_attn.k_proj.bias"] = {2};
      t[p + "self_attn.v_proj.bias"] = {2};
    }
  }
  if (!tied) t["lm_head.weight"] = {5, 4};
  return t;
}

// Every tensor is filled with (tensor index + element index / 100) in the given dtype, so each
// loaded value says where it came from.
class WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("weights_test_" +
            std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  static float Value(int tensor, int64_t i) { return static_cast<float>(tensor) + i / 100.0f; }

  void Write(const std::map<std::string, std::vector<int64_t>>& shapes, DType dtype) {
    std::map<std::string, TensorToWrite> tensors;
    int index = 0;
    for (const auto& [name, shape] : shapes) {
      TensorToWrite& t = tensors[name];
      t.dtype = dtype;
      t.shape = shape;
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      std::vector<float> values(n);
      for (int64_t i = 0; i < n; ++i) values[i] = Value(index, i);
      if (dtype == DType::kF32) {
        t.bytes.resize(n * 4);
        std::memcpy(t.bytes.data(), values.data(), n * 4);
      } else {  // bf16 by truncation; the test values below are compared with tolerance
        t.bytes.resize(n * 2);
        for (int64_t i = 0; i < n; ++i) {
          uint32_t u;
          std::memcpy(&u, &values[i], 4);
          const uint16_t h = static_cast<uint16_t>(u >> 16);
          std::memcpy(t.bytes.data() + 2 * i, &h, 2);
        }
      }
      indices_[name] = index++;
    }
    ASSERT_TRUE(WriteSafetensors((dir_ / "model.safetensors").string(), tensors).ok());
  }

  absl::StatusOr<ModelWeights> Load(const ModelConfig& config) {
    absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(dir_.string());
    if (!store.ok()) return store.status();
    return LoadCpuWeights(config, **store);
  }

  fs::path dir_;
  std::map<std::string, int> indices_;
};

TEST_F(WeightsTest, LoadsLlamaUntied) {
  auto shapes = ExpectedTensors(false, false);
  shapes["model.layers.0.self_attn.rotary_emb.inv_freq"] = {1};  // extra: ignored
  Write(shapes, DType::kF32);
  absl::StatusOr<ModelWeights> w = Load(SmallConfig(false, false));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->layers.size(), 2u);
  const int q1 = indices_["model.layers.1.self_attn.q_proj.weight"];
  ASSERT_EQ(w->layers[1].q_proj.size(), 16u);
  EXPECT_FLOAT_EQ(w->layers[1].q_proj[0], Value(q1, 0));
  EXPECT_FLOAT_EQ(w->layers[1].q_proj[13], Value(q1, 13));
  const int down0 = indices_["model.layers.0.mlp.down_proj.weight"];
  ASSERT_EQ(w->layers[0].down_proj.size(), 24u);
  EXPECT_FLOAT_EQ(w->layers[0].down_proj[23], Value(down0, 23));
  EXPECT_EQ(w->layers[0].k_proj.size(), 8u);
  EXPECT_EQ(w->layers[0].gate_proj.size(), 24u);
  EXPECT_EQ(w->layers[0].input_norm.size(), 4u);
  EXPECT_EQ(w->layers[0].post_norm.size(), 4u);
  EXPECT_TRUE(w->layers[0].q_bias.empty());
  EXPECT_EQ(w->embed.size(), 20u);
  EXPECT_EQ(w->final_norm.size(), 4u);
  ASSERT_EQ(w->lm_head.size(), 20u);
  EXPECT_FLOAT_EQ(w->LmHead()[7], Value(indices_["lm_head.weight"], 7));
}

TEST_F(WeightsTest, LoadsQwen2BiasesTiedFromBf16) {
  Write(ExpectedTensors(true, true), DType::kBF16);
  absl::StatusOr<ModelWeights> w = Load(SmallConfig(true, true));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_EQ(w->layers[1].k_bias.size(), 2u);
  const int kb = indices_["model.layers.1.self_attn.k_proj.bias"];
  EXPECT_NEAR(w->layers[1].k_bias[1], Value(kb, 1), 0.1f);
  EXPECT_EQ(w->layers[0].q_bias.size(), 4u);
  EXPECT_EQ(w->layers[0].v_bias.size(), 2u);
  EXPECT_TRUE(w->lm_head.empty());
  EXPECT_EQ(&w->LmHead(), &w->embed);
}

TEST_F(WeightsTest, MissingTensorIsNamed) {
  auto shapes = ExpectedTensors(false, false);
  shapes.erase("model.layers.1.mlp.up_proj.weight");
  Write(shapes, DType::kF32);
  absl::StatusOr<ModelWeights> w = Load(SmallConfig(false, false));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));
}

TEST_F(WeightsTest, MissingBiasForQwen2IsNamed) {
  Write(ExpectedTensors(false, false), DType::kF32);
  absl::StatusOr<ModelWeights> w = Load(SmallConfig(true, false));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.self_attn.q_proj.bias"));
}

TEST_F(WeightsTest, MissingLmHeadWhenUntiedIsNamed) {
  Write(ExpectedTensors(false, true), DType::kF32);
  absl::StatusOr<ModelWeights> w = Load(SmallConfig(false, false));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("lm_head.weight"));
}

TEST_F(WeightsTest, WrongShapeNamesTensorAndFile) {
  auto shapes = ExpectedTensors(false, false);
  shapes["model.layers.0.self_attn.k_proj.weight"] = {4, 4};  // as if kv_heads were 2
  Write(shapes, DType::kF32);
  absl::StatusOr<ModelWeights> w = Load(SmallConfig(false, false));
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.self_attn.k_proj.weight"));
  EXPECT_THAT(w.status().message(), HasSubstr("model.safetensors"));
}

}  // namespace
}  // namespace tandem
