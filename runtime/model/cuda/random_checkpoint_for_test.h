#pragma once
// Test-only: writes a small Hugging Face checkpoint with random bf16 weights (normal
// distributions, seeded) for the CUDA runner tests, as Llama (optionally with Qwen2's QKV
// biases). Header-only; include it from test files only. Failures are reported through gtest
// (EXPECT) and leave a partial directory behind.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/model/safetensors.h"

namespace tandem::testing_util {

struct RandomCheckpoint {
  bool qwen2 = false;  // Qwen2ForCausalLM with q/k/v biases; LlamaForCausalLM otherwise
  int vocab = 512;
  int hidden = 256;
  int inter = 512;
  int layers = 2;
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 64;
  int max_positions = 4096;
  double rms_norm_eps = 1e-6;
  double rope_theta = 1000000.0;
  float lm_head_std = 0.05f;  // small: near-flat logits
  float proj_std = 0.05f;     // every projection matrix
  uint32_t seed = 7;
};

// Writes config.json and model.safetensors of `spec` into `dir` (which must exist); returns dir.
inline std::string WriteRandomCheckpoint(const std::string& dir, const RandomCheckpoint& spec) {
  const RandomCheckpoint& c = spec;
  std::ofstream(dir + "/config.json") << absl::StrCat(
      R"({"architectures": [")", c.qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM",
      R"("], "model_type": ")", c.qwen2 ? "qwen2" : "llama", R"(", "vocab_size": )", c.vocab,
      R"(, "hidden_size": )", c.hidden, R"(, "intermediate_size": )", c.inter,
      R"(, "num_hidden_layers": )", c.layers, R"(, "num_attention_heads": )", c.heads,
      R"(, "num_key_value_heads": )", c.kv_heads, R"(, "max_position_embeddings": )",
      c.max_positions, R"(, "rms_norm_eps": )", c.rms_norm_eps, R"(, "rope_theta": )", c.rope_theta,
      R"(, "tie_word_embeddings": false, "torch_dtype": "bfloat16"})");
  std::mt19937 rng(c.seed);
  std::map<std::string, TensorToWrite> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float mean, float stddev) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::normal_distribution<float> dist(mean, stddev);
    TensorToWrite t{DType::kBF16, shape, std::vector<uint8_t>(n * 2)};
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = FloatToBf16(dist(rng));
      std::memcpy(t.bytes.data() + i * 2, &b, 2);
    }
    tensors.emplace(name, std::move(t));
  };
  const int q = c.heads * c.head_dim, kv = c.kv_heads * c.head_dim;
  add("model.embed_tokens.weight", {c.vocab, c.hidden}, 0, 1.0f);
  add("lm_head.weight", {c.vocab, c.hidden}, 0, c.lm_head_std);
  add("model.norm.weight", {c.hidden}, 1, 0.1f);
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {c.hidden}, 1, 0.1f);
    add(p + "post_attention_layernorm.weight", {c.hidden}, 1, 0.1f);
    add(p + "self_attn.q_proj.weight", {q, c.hidden}, 0, c.proj_std);
    add(p + "self_attn.k_proj.weight", {kv, c.hidden}, 0, c.proj_std);
    add(p + "self_attn.v_proj.weight", {kv, c.hidden}, 0, c.proj_std);
    if (c.qwen2) {
      add(p + "self_attn.q_proj.bias", {q}, 0, 0.5f);
      add(p + "self_attn.k_proj.bias", {kv}, 0, 0.5f);
      add(p + "self_attn.v_proj.bias", {kv}, 0, 0.5f);
    }
    add(p + "self_attn.o_proj.weight", {c.hidden, q}, 0, c.proj_std);
    add(p + "mlp.gate_proj.weight", {c.inter, c.hidden}, 0, c.proj_std);
    add(p + "mlp.up_proj.weight", {c.inter, c.hidden}, 0, c.proj_std);
    add(p + "mlp.down_proj.weight", {c.hidden, c.inter}, 0, c.proj_std);
  }
  const absl::Status s = WriteSafetensors(dir + "/model.safetensors", tensors);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

}  // namespace tandem::testing_util
