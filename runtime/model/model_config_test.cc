#include "runtime/model/model_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// config.json of meta-llama/Llama-2-7b-hf (as published on the Hub).
constexpr char kLlama2[] = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
  "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
  "tie_word_embeddings": false, "torch_dtype": "float16", "transformers_version": "4.31.0.dev0",
  "use_cache": true, "vocab_size": 32000})";

// config.json of meta-llama/Llama-3.1-8B-Instruct.
constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.42.3", "use_cache": true, "vocab_size": 128256})";

// config.json of meta-llama/Llama-3.2-1B.
constexpr char kLlama32[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";

// config.json of Qwen/Qwen2.5-7B-Instruct.
constexpr char kQwen25[] = R"({
  "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
  "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 3584,
  "initializer_range": 0.02, "intermediate_size": 18944, "max_position_embeddings": 32768,
  "max_window_layers": 28, "model_type": "qwen2", "num_attention_heads": 28,
  "num_hidden_layers": 28, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 152064})";

TEST(ModelConfigTest, ParsesLlama2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama2, "llama2.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kLlama);
  EXPECT_EQ(c->vocab_size, 32000);
  EXPECT_EQ(c->hidden_size, 4096);
  EXPECT_EQ(c->intermediate_size, 11008);
  EXPECT_EQ(c->num_layers, 32);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 32);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->max_position_embeddings, 4096);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 10000.0f);  // absent: HF default
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_EQ(c->torch_dtype, "float16");
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
}

TEST(ModelConfigTest, ParsesLlama31RopeScalingAndEosList) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31, "llama31.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(c->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
}

TEST(ModelConfigTest, ParsesLlama32TiedWithHeadDim) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama32, "llama32.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_layers, 16);
  EXPECT_FLOAT_EQ(c->rope_scaling.factor, 32.0f);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001));
}

TEST(ModelConfigTest, ParsesQwen25WithAttentionBias) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen25, "qwen.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kQwen2);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->vocab_size, 152064);
  EXPECT_EQ(c->num_heads, 28);
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_FLOAT_EQ(c->rope_theta, 1e6f);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
}

TEST(ModelConfigTest, DefaultsKvHeadsAndAcceptsDefaultRopeType) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(
      R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
          "rope_scaling": {"type": "default"}, "head_dim": null, "bos_token_id": null})",
      "x.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 4);
  EXPECT_EQ(c->head_dim, 16);
  EXPECT_EQ(c->rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

std::string WithRopeScaling(const std::string& rope_scaling) {
  std::string text = kLlama2;
  const std::string from = R"("rope_scaling": null)";
  text.replace(text.find(from), from.size(), R"("rope_scaling": )" + rope_scaling);
  return text;
}

TEST(ModelConfigTest, RejectsUnsupportedRopeScalingTypes) {
  for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
    for (const char* key : {"type", "rope_type"}) {
      absl::StatusOr<ModelConfig> c = ParseModelConfig(
          WithRopeScaling(std::string(R"({")") + key + R"(": ")" + type + R"(", "factor": 2.0})"),
          "cfg.json");
      ASSERT_FALSE(c.ok()) << type;
      EXPECT_THAT(c.status().message(), HasSubstr("cfg.json"));
      EXPECT_THAT(c.status().message(), HasSubstr(type));
    }
  }
}

TEST(ModelConfigTest, RejectsUnknownArchitecture) {
  std::string text = kLlama2;
  text.replace(text.find("LlamaForCausalLM"), 16, "GPT2LMHeadModel");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(text, "gpt2/config.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("gpt2/config.json"));
  EXPECT_THAT(c.status().message(), HasSubstr("GPT2LMHeadModel"));
}

TEST(ModelConfigTest, RejectsMissingAndMistypedFields) {
  std::string missing = kLlama2;
  missing.replace(missing.find(R"("hidden_size": 4096,)"), 20, "");
  absl::StatusOr<ModelConfig> c = ParseModelConfig(missing, "m.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("hidden_size"));
  EXPECT_THAT(c.status().message(), HasSubstr("m.json"));

  std::string mistyped = kLlama2;
  mistyped.replace(mistyped.find(R"("vocab_size": 32000)"), 19, R"("vocab_size": "many")");
  c = ParseModelConfig(mistyped, "t.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("vocab_size"));

  std::string bad_kv = kLlama2;
  bad_kv.replace(bad_kv.find(R"("num_key_value_heads": 32)"), 25, R"("num_key_value_heads": 5)");
  c = ParseModelConfig(bad_kv, "kv.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("num_key_value_heads"));

  c = ParseModelConfig(WithRopeScaling(R"({"rope_type": "llama3"})"), "f.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("factor"));
}

TEST(ModelConfigTest, RejectsBadJson) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig("{\"vocab_size\": ", "broken.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("broken.json"));
  c = ParseModelConfig("[1, 2]", "array.json");
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("array.json"));
}

TEST(ModelConfigTest, LoadsFromDirectoryAndNamesMissingFile) {
  const std::filesystem::path dir =
      std::filesystem::path(testing::TempDir()) / "model_config_test_dir";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << kQwen25;
  absl::StatusOr<ModelConfig> c = LoadModelConfig(dir.string());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, ModelArchitecture::kQwen2);

  c = LoadModelConfig((dir / "nope").string());
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(), HasSubstr("nope/config.json"));
}

}  // namespace
}  // namespace tandem
