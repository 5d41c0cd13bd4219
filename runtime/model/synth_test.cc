#include "runtime/model/synth.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::Contains;
using ::testing::HasSubstr;

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Json ReadJson(const fs::path& path) { return Json::parse(ReadAll(path)); }

class SynthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) /
           ("synth_test_" +
            std::string(testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  absl::Status Synth(const std::string& like, const fs::path& out, uint64_t seed, int threads,
                     const std::string& tokenizer = "") {
    SynthOptions options;
    options.like = like;
    options.out_dir = out.string();
    options.seed = seed;
    options.num_threads = threads;
    options.tokenizer_path = tokenizer;
    return SynthesizeModel(options, nullptr);
  }

  fs::path dir_;
};

TEST_F(SynthTest, TinyLoadsWithConfigStoreAndWeights) {
  const fs::path out = dir_ / "tiny";
  ASSERT_TRUE(Synth("tiny", out, 1, 2).ok());
  absl::StatusOr<ModelConfig> config = LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->architecture, ModelArchitecture::kLlama);
  EXPECT_EQ(config->hidden_size, 256);
  EXPECT_EQ(config->intermediate_size, 768);
  EXPECT_EQ(config->num_layers, 4);
  EXPECT_EQ(config->num_heads, 8);
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 32);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->rope_scaling.kind, RopeScaling::Kind::kLlama3);

  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(out.string());
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<ModelWeights> weights = LoadCpuWeights(*config, **store);
  ASSERT_TRUE(weights.ok()) << weights.status();

  // Sharded: at least two shard files, each named by the index.
  const Json index = ReadJson(out / "model.safetensors.index.json");
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items()) shards.insert(file);
  EXPECT_GE(shards.size(), 2u);
  for (const std::string& shard : shards) EXPECT_TRUE(fs::exists(out / shard)) << shard;
  EXPECT_FALSE(fs::exists(out / "model.safetensors"));
  for (const std::string& name : (*store)->Names()) {
    EXPECT_EQ((*store)->Get(name)->dtype, DType::kBF16) << name;
  }

  // Statistics: linears ~N(0, 0.02), residual projections smaller, norms exactly 1.
  auto stats = [](const std::vector<float>& v) {
    double sum = 0, sq = 0;
    for (float x : v) sum += x, sq += double{x} * x;
    const double mean = sum / v.size();
    return std::pair<double, double>(mean, std::sqrt(sq / v.size() - mean * mean));
  };
  auto [q_mean, q_std] = stats(weights->layers[2].q_proj);
  EXPECT_NEAR(q_mean, 0.0, 0.002);
  EXPECT_NEAR(q_std, 0.02, 0.002);
  auto [e_mean, e_std] = stats(weights->embed);
  EXPECT_NEAR(e_std, 0.02, 0.002);
  auto [o_mean, o_std] = stats(weights->layers[0].down_proj);
  EXPECT_NEAR(o_std, 0.02 / std::sqrt(8.0), 0.001);
  for (float x : weights->layers[3].input_norm) ASSERT_EQ(x, 1.0f);
  for (float x : weights->final_norm) ASSERT_EQ(x, 1.0f);
  // Different tensors get different values.
  EXPECT_NE(weights->layers[0].gate_proj, weights->layers[0].up_proj);
}

TEST_F(SynthTest, SameSeedGivesIdenticalBytesWhateverTheThreadCount) {
  ASSERT_TRUE(Synth("tiny", dir_ / "a", 7, 1).ok());
  ASSERT_TRUE(Synth("tiny", dir_ / "b", 7, 3).ok());
  ASSERT_TRUE(Synth("tiny", dir_ / "c", 8, 2).ok());
  int files = 0, differing = 0;
  for (const fs::directory_entry& e : fs::directory_iterator(dir_ / "a")) {
    const std::string name = e.path().filename().string();
    ++files;
    EXPECT_EQ(ReadAll(e.path()), ReadAll(dir_ / "b" / name)) << name;
    if (ReadAll(e.path()) != ReadAll(dir_ / "c" / name)) ++differing;
  }
  EXPECT_GE(files, 7);      // config, generation config, tokenizer x2, index, >= 2 shards
  EXPECT_GE(differing, 2);  // another seed changes the shards
}

TEST_F(SynthTest, UnsupportedLikeFails) {
  absl::Status s = Synth("gpt-5", dir_ / "x", 0, 1);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("gpt-5"));
  EXPECT_FALSE(SynthConfigFor("llama-2-70b").ok());
}

// Independent reference: GPT-2's bytes_to_unicode maps space to U+0120 "Ġ", newline to U+010A
// "Ċ", tab to U+0109 "ĉ", byte 0 to U+0100 "Ā", printable ASCII to itself.
TEST_F(SynthTest, DefaultTokenizerIsByteLevelBpeMatchingConfig) {
  const fs::path out = dir_ / "tiny";
  ASSERT_TRUE(Synth("tiny", out, 0, 2).ok());
  const Json tok = ReadJson(out / "tokenizer.json");
  EXPECT_EQ(tok["model"]["type"], "BPE");
  EXPECT_EQ(tok["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(tok["pre_tokenizer"]["add_prefix_space"], false);
  EXPECT_EQ(tok["pre_tokenizer"]["use_regex"], true);
  EXPECT_EQ(tok["decoder"]["type"], "ByteLevel");
  const Json& vocab = tok["model"]["vocab"];
  for (const char* token : {"\u0120", "\u010A", "\u0109", "\u0100", "a", "Z", "!", "~"}) {
    EXPECT_TRUE(vocab.contains(token)) << token;
  }
  EXPECT_FALSE(vocab.contains(" "));

  std::set<int> ids;
  for (const auto& [token, id] : vocab.items()) ids.insert(id.get<int>());
  EXPECT_EQ(ids.size(), vocab.size());
  ASSERT_TRUE(tok["model"]["merges"].is_array());
  EXPECT_GE(tok["model"]["merges"].size(), 100u);
  EXPECT_TRUE(vocab.contains("\u0120the"));  // the most common English word is a token
  for (const Json& merge : tok["model"]["merges"]) {
    const std::string m = merge.get<std::string>();
    const size_t space = m.find(' ');
    ASSERT_NE(space, std::string::npos) << m;
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    EXPECT_TRUE(vocab.contains(left) && vocab.contains(right) && vocab.contains(left + right)) << m;
  }
  std::map<std::string, int> special;
  for (const Json& a : tok["added_tokens"]) {
    EXPECT_EQ(a["special"], true);
    special[a["content"]] = a["id"];
    ids.insert(a["id"].get<int>());
  }
  ASSERT_EQ(special.size(), 4u);
  for (const char* s : {"<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"}) {
    EXPECT_TRUE(special.count(s)) << s;
  }
  // Ids are 0..n-1 and the model's vocabulary is exactly the tokenizer's.
  EXPECT_EQ(*ids.begin(), 0);
  EXPECT_EQ(*ids.rbegin() + 1, static_cast<int>(ids.size()));
  absl::StatusOr<ModelConfig> config = LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok());
  EXPECT_EQ(config->vocab_size, static_cast<int>(ids.size()));
  EXPECT_EQ(config->bos_token_id, special["<|begin_of_text|>"]);
  EXPECT_THAT(config->eos_token_ids, Contains(special["<|im_end|>"]));
  EXPECT_THAT(config->eos_token_ids, Contains(special["<|end_of_text|>"]));

  const Json tc = ReadJson(out / "tokenizer_config.json");
  EXPECT_EQ(tc["bos_token"], "<|begin_of_text|>");
  EXPECT_EQ(tc["eos_token"], "<|im_end|>");
  EXPECT_EQ(tc["chat_template"],
            "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
            "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if "
            "add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}");
  const Json gen = ReadJson(out / "generation_config.json");
  EXPECT_EQ(gen["bos_token_id"], special["<|begin_of_text|>"]);
}

TEST_F(SynthTest, UserTokenizerSetsVocabAndIsCopied) {
  const fs::path src = dir_ / "src";
  fs::create_directories(src);
  std::ofstream(src / "tokenizer.json") << R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 40}, "merges": ["a b"]},
    "added_tokens": [{"id": 299, "content": "<|eot_id|>", "special": true},
                     {"id": 298, "content": "<|begin_of_text|>", "special": true}]})";
  std::ofstream(src / "tokenizer_config.json")
      << R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>"}})";
  const fs::path out = dir_ / "out";
  ASSERT_TRUE(Synth("tiny", out, 0, 2, (src / "tokenizer.json").string()).ok());
  absl::StatusOr<ModelConfig> config = LoadModelConfig(out.string());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->vocab_size, 300);
  EXPECT_EQ(config->bos_token_id, 298);
  EXPECT_THAT(config->eos_token_ids, Contains(299));
  EXPECT_EQ(ReadAll(out / "tokenizer.json"), ReadAll(src / "tokenizer.json"));
  EXPECT_EQ(ReadAll(out / "tokenizer_config.json"), ReadAll(src / "tokenizer_config.json"));
  absl::StatusOr<std::unique_ptr<TensorStore>> store = TensorStore::Open(out.string());
  ASSERT_TRUE(store.ok());
  EXPECT_TRUE((*store)->GetWithShape("model.embed_tokens.weight", {300, 256}).ok());

  EXPECT_FALSE(Synth("tiny", dir_ / "bad", 0, 1, (src / "nope.json").string()).ok());
}

int64_t ParamCount(const ModelConfig& c) {
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads} * c.head_dim,
                kv = int64_t{c.num_kv_heads} * c.head_dim, i = c.intermediate_size;
  int64_t layer = 2 * h * q + 2 * h * kv + 3 * h * i + 2 * h;
  if (c.attention_bias) layer += q + 2 * kv;
  return int64_t{c.vocab_size} * h * (c.tie_word_embeddings ? 1 : 2) + c.num_layers * layer + h;
}

// Published sizes: Llama-3-8B 8,030,261,248; Llama-3.2-1B 1,235,814,400; Qwen2.5-7B
// 7,615,616,512 parameters.
TEST_F(SynthTest, RealShapeConfigsMatchPublishedModels) {
  absl::StatusOr<ModelConfig> l8 = SynthConfigFor("llama-3-8b");
  ASSERT_TRUE(l8.ok()) << l8.status();
  EXPECT_EQ(l8->architecture, ModelArchitecture::kLlama);
  EXPECT_EQ(l8->hidden_size, 4096);
  EXPECT_EQ(l8->intermediate_size, 14336);
  EXPECT_EQ(l8->num_layers, 32);
  EXPECT_EQ(l8->num_heads, 32);
  EXPECT_EQ(l8->num_kv_heads, 8);
  EXPECT_EQ(l8->vocab_size, 128256);
  EXPECT_FLOAT_EQ(l8->rope_theta, 500000.0f);
  EXPECT_EQ(l8->rope_scaling.kind, RopeScaling::Kind::kNone);
  EXPECT_FALSE(l8->tie_word_embeddings);
  EXPECT_EQ(ParamCount(*l8), 8030261248);
  EXPECT_EQ(l8->max_position_embeddings, 8192);

  // Llama-3.1-8B: the same weights' shape, a 128K context through llama3 RoPE scaling.
  absl::StatusOr<ModelConfig> l31 = SynthConfigFor("llama-3.1-8b");
  ASSERT_TRUE(l31.ok()) << l31.status();
  EXPECT_EQ(ParamCount(*l31), 8030261248);
  EXPECT_EQ(l31->max_position_embeddings, 131072);
  EXPECT_EQ(l31->rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_FLOAT_EQ(l31->rope_scaling.factor, 8.0f);
  EXPECT_EQ(l31->rope_scaling.original_max_position_embeddings, 8192);

  absl::StatusOr<ModelConfig> l1 = SynthConfigFor("llama-3.2-1b");
  ASSERT_TRUE(l1.ok()) << l1.status();
  EXPECT_EQ(l1->hidden_size, 2048);
  EXPECT_EQ(l1->intermediate_size, 8192);
  EXPECT_EQ(l1->num_layers, 16);
  EXPECT_EQ(l1->num_kv_heads, 8);
  EXPECT_EQ(l1->head_dim, 64);
  EXPECT_TRUE(l1->tie_word_embeddings);
  EXPECT_EQ(l1->rope_scaling.kind, RopeScaling::Kind::kLlama3);
  EXPECT_FLOAT_EQ(l1->rope_scaling.factor, 32.0f);
  EXPECT_FLOAT_EQ(l1->rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(l1->rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(l1->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(ParamCount(*l1), 1235814400);

  absl::StatusOr<ModelConfig> qw = SynthConfigFor("qwen2.5-7b");
  ASSERT_TRUE(qw.ok()) << qw.status();
  EXPECT_EQ(qw->architecture, ModelArchitecture::kQwen2);
  EXPECT_TRUE(qw->attention_bias);
  EXPECT_EQ(qw->vocab_size, 152064);
  EXPECT_FLOAT_EQ(qw->rope_theta, 1e6f);
  EXPECT_EQ(ParamCount(*qw), 7615616512);
}

}  // namespace
}  // namespace tandem
