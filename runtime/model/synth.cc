#include "runtime/model/synth.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"
#include "runtime/model/safetensors.h"

namespace tandem {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kDefaultShardBytes = size_t{2} << 30;
constexpr size_t kTinyShardBytes = size_t{4} << 20;
constexpr float kInitStd = 0.02f;
constexpr int kMaxMerges = 320;

// ---------------------------------------------------------------------------------------------
// Built-in byte-level BPE tokenizer.

// English text the built-in tokenizer learns its merges from (any text works; merges only make
// common words shorter).
constexpr const char kMergeCorpus[] =
    "The quick brown fox jumps over the lazy dog. This is a small model that was made for "
    "testing, and it does not know anything about the world. It has random weights, so the text "
    "it writes will not make sense, but the shapes of its tensors are the same as those of a real "
    "model. When you ask it a question, it will answer with tokens that it picks from the "
    "vocabulary. The people who wrote this program wanted to check that every part of the system "
    "works: the router, the prefill workers, the decode workers and the transfer of the cache "
    "between them. They also wanted to measure how fast it can run on a machine with one or more "
    "graphics cards. In the beginning there was only a plan, and then there were tests, and then "
    "there was the code that made the tests pass. Every request starts with a prompt. The prompt "
    "is split into tokens, the tokens are turned into vectors, and the vectors flow through the "
    "layers of the model one after another. Each layer has attention and a feed forward network. "
    "The attention looks at all of the tokens that came before, and the network changes each "
    "vector on its own. At the end, the model gives a score to every token in the vocabulary, and "
    "the next token is chosen from those scores. Then the new token is added to the sequence and "
    "the whole process starts again, until the model writes a stop token or reaches the limit. "
    "Hello, how are you today? I am fine, thank you. What would you like to do this afternoon? "
    "We could go for a walk in the park, read a book, or write some code together. There is "
    "nothing better than a quiet evening at home with a good story and a cup of tea. Once upon a "
    "time, in a land far away, there lived a king who had three daughters. The youngest one was "
    "the most beautiful, and she liked to play in the garden near the old well. One day her "
    "golden ball fell into the water, and she began to cry. A frog put his head out of the water "
    "and said: what is the matter with you? You are crying so much that even a stone would feel "
    "sorry for you. Numbers such as 1, 2, 3, 10, 100 and 2024 appear in text too, as do names "
    "like Alice, Bob and Carol, and words like system, user, assistant, model and message. ";

// GPT-2's bytes_to_unicode: the printable code point each byte is written as in the vocabulary.
std::vector<std::string> ByteLevelAlphabet() {
  std::vector<int> code_point(256, -1);
  auto keep = [&](int lo, int hi) {
    for (int b = lo; b <= hi; ++b) code_point[b] = b;
  };
  keep('!', '~');
  keep(0xA1, 0xAC);
  keep(0xAE, 0xFF);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    if (code_point[b] < 0) code_point[b] = next++;
  }
  std::vector<std::string> alphabet(256);
  for (int b = 0; b < 256; ++b) {
    const int cp = code_point[b];
    std::string utf8;
    if (cp < 0x80) {
      utf8.push_back(static_cast<char>(cp));
    } else {
      utf8.push_back(static_cast<char>(0xC0 | (cp >> 6)));
      utf8.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
    alphabet[b] = utf8;
  }
  return alphabet;
}

enum class CharClass { kLetter, kDigit, kSpace, kOther };

CharClass Classify(unsigned char c) {
  if (std::isalpha(c)) return CharClass::kLetter;
  if (std::isdigit(c)) return CharClass::kDigit;
  if (std::isspace(c)) return CharClass::kSpace;
  return CharClass::kOther;
}

// Splits ASCII text like GPT-2's pre-tokenizer does: " ?letters", " ?digits", " ?other", spaces.
std::vector<std::string> PreTokenize(const std::string& text) {
  std::vector<std::string> words;
  size_t i = 0;
  while (i < text.size()) {
    size_t start = i;
    if (text[i] == ' ' && i + 1 < text.size() &&
        Classify(static_cast<unsigned char>(text[i + 1])) != CharClass::kSpace) {
      ++i;
    }
    const CharClass cls = Classify(static_cast<unsigned char>(text[i]));
    while (i < text.size() && Classify(static_cast<unsigned char>(text[i])) == cls) ++i;
    words.push_back(text.substr(start, i - start));
  }
  return words;
}

struct Tokenizer {
  Json tokenizer_json;
  Json tokenizer_config;                // null when a copied tokenizer has none beside it
  std::string tokenizer_config_source;  // path to copy instead of writing tokenizer_config
  int vocab_size = 0;
  int bos_id = -1;
  std::vector<int> eos_ids;
};

Tokenizer BuildDefaultTokenizer() {
  const std::vector<std::string> alphabet = ByteLevelAlphabet();
  Json vocab = Json::object();
  int next_id = 0;
  for (int b = 0; b < 256; ++b) vocab[alphabet[b]] = next_id++;

  // Learn merges: repeatedly join the most frequent adjacent pair (ties: smallest pair).
  std::map<std::string, int> word_counts;
  for (const std::string& w : PreTokenize(kMergeCorpus)) ++word_counts[w];
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, count] : word_counts) {
    std::vector<std::string> symbols;
    for (unsigned char c : w) symbols.push_back(alphabet[c]);
    words.emplace_back(std::move(symbols), count);
  }
  Json merges = Json::array();
  for (int m = 0; m < kMaxMerges; ++m) {
    std::map<std::pair<std::string, std::string>, int> pair_counts;
    for (const auto& [symbols, count] : words) {
      for (size_t i = 0; i + 1 < symbols.size(); ++i) {
        pair_counts[{symbols[i], symbols[i + 1]}] += count;
      }
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;  // a merge must occur at least twice
    for (const auto& [pair, count] : pair_counts) {
      if (count > best_count) {
        best = &pair;
        best_count = count;
      }
    }
    if (best == nullptr) break;
    const auto [left, right] = *best;
    merges.push_back(left + " " + right);
    const std::string joined = left + right;
    if (!vocab.contains(joined)) vocab[joined] = next_id++;
    for (auto& [symbols, count] : words) {
      std::vector<std::string> merged;
      for (size_t i = 0; i < symbols.size(); ++i) {
        if (i + 1 < symbols.size() && symbols[i] == left && symbols[i + 1] == right) {
          merged.push_back(joined);
          ++i;
        } else {
          merged.push_back(symbols[i]);
        }
      }
      symbols = std::move(merged);
    }
  }

  Tokenizer t;
  Json added = Json::array();
  std::map<std::string, int> special_ids;
  for (const char* content :
       {"<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>"}) {
    special_ids[content] = next_id;
    added.push_back({{"id", next_id},
                     {"content", content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    ++next_id;
  }
  t.vocab_size = next_id;
  t.bos_id = special_ids["<|begin_of_text|>"];
  t.eos_ids = {special_ids["<|end_of_text|>"], special_ids["<|im_end|>"]};

  Json byte_level = {{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", true},
                     {"use_regex", true}};
  t.tokenizer_json = {{"version", "1.0"},
                      {"truncation", nullptr},
                      {"padding", nullptr},
                      {"added_tokens", added},
                      {"normalizer", nullptr},
                      {"pre_tokenizer", byte_level},
                      {"post_processor", nullptr},
                      {"decoder", byte_level},
                      {"model",
                       {{"type", "BPE"},
                        {"dropout", nullptr},
                        {"unk_token", nullptr},
                        {"continuing_subword_prefix", nullptr},
                        {"end_of_word_suffix", nullptr},
                        {"fuse_unk", false},
                        {"byte_fallback", false},
                        {"ignore_merges", false},
                        {"vocab", vocab},
                        {"merges", merges}}}};

  Json added_decoder = Json::object();
  for (const Json& a : added) {
    added_decoder[std::to_string(a["id"].get<int>())] = {
        {"content", a["content"]}, {"lstrip", false},      {"normalized", false},
        {"rstrip", false},         {"single_word", false}, {"special", true}};
  }
  t.tokenizer_config = {
      {"add_bos_token", false},
      {"add_eos_token", false},
      {"added_tokens_decoder", added_decoder},
      {"bos_token", "<|begin_of_text|>"},
      {"eos_token", "<|im_end|>"},
      {"pad_token", "<|end_of_text|>"},
      {"clean_up_tokenization_spaces", false},
      {"model_max_length", 8192},
      {"tokenizer_class", "PreTrainedTokenizerFast"},
      {"chat_template",
       "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
       "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
       "{{ '<|im_start|>assistant\\n' }}{% endif %}"}};
  return t;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return text.str();
}

absl::StatusOr<Json> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON: ", e.what()));
  }
}

// The content of a tokenizer_config.json special-token entry: a string or {"content": ...}.
std::string TokenContent(const Json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return "";
  const Json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// Reads a user-supplied tokenizer.json: its vocabulary size and special token ids.
absl::StatusOr<Tokenizer> LoadUserTokenizer(const std::string& path) {
  Tokenizer t;
  ASSIGN_OR_RETURN(t.tokenizer_json, ReadJson(path));
  const Json& tj = t.tokenizer_json;
  std::map<std::string, int> ids;
  int max_id = -1;
  try {
    if (!tj.is_object() || !tj.contains("model") || !tj["model"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no \"model\" object"));
    }
    const Json& vocab = tj["model"].value("vocab", Json());
    if (vocab.is_object()) {
      for (const auto& [token, id] : vocab.items()) {
        ids[token] = id.get<int>();
        max_id = std::max(max_id, id.get<int>());
      }
    } else if (vocab.is_array()) {  // Unigram: [[piece, score], ...], ids are positions
      for (size_t i = 0; i < vocab.size(); ++i) {
        if (vocab[i].is_array() && !vocab[i].empty() && vocab[i][0].is_string()) {
          ids[vocab[i][0].get<std::string>()] = static_cast<int>(i);
        }
      }
      max_id = static_cast<int>(vocab.size()) - 1;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": model.vocab is missing"));
    }
    if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
      for (const Json& a : tj["added_tokens"]) {
        const int id = a.at("id").get<int>();
        ids[a.at("content").get<std::string>()] = id;
        max_id = std::max(max_id, id);
      }
    }
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", e.what()));
  }
  if (max_id < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": empty vocabulary"));
  t.vocab_size = max_id + 1;

  const fs::path config_path = fs::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  Json config;
  if (fs::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(config, ReadJson(config_path.string()));
    t.tokenizer_config_source = config_path.string();
  }
  auto id_of = [&](const std::string& content) {
    auto it = ids.find(content);
    return it == ids.end() ? -1 : it->second;
  };
  t.bos_id = id_of(TokenContent(config, "bos_token"));
  if (t.bos_id < 0) t.bos_id = id_of("<|begin_of_text|>");
  if (t.bos_id < 0) t.bos_id = id_of("<s>");
  std::vector<std::string> eos = {TokenContent(config, "eos_token"),
                                  "<|end_of_text|>",
                                  "<|eot_id|>",
                                  "<|im_end|>",
                                  "<|endoftext|>",
                                  "</s>"};
  for (const std::string& content : eos) {
    const int id = id_of(content);
    if (id >= 0 && std::find(t.eos_ids.begin(), t.eos_ids.end(), id) == t.eos_ids.end()) {
      t.eos_ids.push_back(id);
    }
  }
  return t;
}

// ---------------------------------------------------------------------------------------------
// Model configs.

Json EosJson(const std::vector<int>& eos) {
  if (eos.size() == 1) return eos[0];
  return eos;
}

Json LlamaRopeScaling(double factor, int original) {
  return {{"rope_type", "llama3"},
          {"factor", factor},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", original}};
}

// config.json for `like`, with the vocabulary and special ids of `tok` (vocab_size only for
// `tiny` or a user tokenizer; the real-shape models keep theirs otherwise).
absl::StatusOr<Json> ConfigJson(const std::string& like, const Tokenizer& tok,
                                bool vocab_from_tokenizer) {
  Json c;
  if (like == "qwen2.5-7b") {
    c = {{"architectures", {"Qwen2ForCausalLM"}},
         {"model_type", "qwen2"},
         {"attention_dropout", 0.0},
         {"hidden_act", "silu"},
         {"hidden_size", 3584},
         {"initializer_range", 0.02},
         {"intermediate_size", 18944},
         {"max_position_embeddings", 32768},
         {"max_window_layers", 28},
         {"num_attention_heads", 28},
         {"num_hidden_layers", 28},
         {"num_key_value_heads", 4},
         {"rms_norm_eps", 1e-6},
         {"rope_scaling", nullptr},
         {"rope_theta", 1000000.0},
         {"sliding_window", 131072},
         {"tie_word_embeddings", false},
         {"use_sliding_window", false},
         {"vocab_size", 152064}};
  } else {
    c = {{"architectures", {"LlamaForCausalLM"}},
         {"model_type", "llama"},
         {"attention_bias", false},
         {"attention_dropout", 0.0},
         {"hidden_act", "silu"},
         {"initializer_range", 0.02},
         {"mlp_bias", false},
         {"pretraining_tp", 1},
         {"rms_norm_eps", 1e-5},
         {"rope_theta", 500000.0}};
    if (like == "tiny") {
      c.update({{"hidden_size", 256},
                {"intermediate_size", 768},
                {"num_hidden_layers", 4},
                {"num_attention_heads", 8},
                {"num_key_value_heads", 2},
                {"head_dim", 32},
                {"max_position_embeddings", 8192},
                {"rope_scaling", LlamaRopeScaling(8.0, 1024)},
                {"tie_word_embeddings", true},
                {"vocab_size", tok.vocab_size}});
    } else if (like == "llama-3.2-1b") {
      c.update({{"hidden_size", 2048},
                {"intermediate_size", 8192},
                {"num_hidden_layers", 16},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 8},
                {"head_dim", 64},
                {"max_position_embeddings", 131072},
                {"rope_scaling", LlamaRopeScaling(32.0, 8192)},
                {"tie_word_embeddings", true},
                {"vocab_size", 128256}});
    } else if (like == "llama-3-8b" || like == "llama-3.1-8b") {
      // Llama-3.1-8B is the same shape with a 128K context (llama3 RoPE scaling).
      const bool long_context = like == "llama-3.1-8b";
      c.update({{"hidden_size", 4096},
                {"intermediate_size", 14336},
                {"num_hidden_layers", 32},
                {"num_attention_heads", 32},
                {"num_key_value_heads", 8},
                {"max_position_embeddings", long_context ? 131072 : 8192},
                {"rope_scaling", long_context ? LlamaRopeScaling(8.0, 8192) : nullptr},
                {"tie_word_embeddings", false},
                {"vocab_size", 128256}});
    } else {
      std::string names;
      for (const std::string& n : SynthModelNames()) absl::StrAppend(&names, " ", n);
      return absl::InvalidArgumentError(
          absl::StrCat("unsupported model \"", like, "\" for synth (supported:", names, ")"));
    }
  }
  if (vocab_from_tokenizer) c["vocab_size"] = tok.vocab_size;
  if (tok.bos_id >= 0) c["bos_token_id"] = tok.bos_id;
  if (!tok.eos_ids.empty()) c["eos_token_id"] = EosJson(tok.eos_ids);
  c["torch_dtype"] = "bfloat16";
  c["transformers_version"] = "4.45.0";
  c["use_cache"] = true;
  return c;
}

// ---------------------------------------------------------------------------------------------
// Random weights.

enum class Init { kLinear, kResidualLinear, kBias, kOnes };

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Init init;
  size_t numel() const {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    return n;
  }
};

std::vector<TensorSpec> TensorSpecs(const ModelConfig& c) {
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const int64_t q_dim = int64_t{c.num_heads} * c.head_dim;
  const int64_t kv_dim = int64_t{c.num_kv_heads} * c.head_dim;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {vocab, hidden}, Init::kLinear});
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    specs.push_back({p + "input_layernorm.weight", {hidden}, Init::kOnes});
    specs.push_back({p + "self_attn.q_proj.weight", {q_dim, hidden}, Init::kLinear});
    specs.push_back({p + "self_attn.k_proj.weight", {kv_dim, hidden}, Init::kLinear});
    specs.push_back({p + "self_attn.v_proj.weight", {kv_dim, hidden}, Init::kLinear});
    if (c.attention_bias) {
      specs.push_back({p + "self_attn.q_proj.bias", {q_dim}, Init::kBias});
      specs.push_back({p + "self_attn.k_proj.bias", {kv_dim}, Init::kBias});
      specs.push_back({p + "self_attn.v_proj.bias", {kv_dim}, Init::kBias});
    }
    specs.push_back({p + "self_attn.o_proj.weight", {hidden, q_dim}, Init::kResidualLinear});
    specs.push_back({p + "post_attention_layernorm.weight", {hidden}, Init::kOnes});
    specs.push_back({p + "mlp.gate_proj.weight", {inter, hidden}, Init::kLinear});
    specs.push_back({p + "mlp.up_proj.weight", {inter, hidden}, Init::kLinear});
    specs.push_back({p + "mlp.down_proj.weight", {hidden, inter}, Init::kResidualLinear});
  }
  specs.push_back({"model.norm.weight", {hidden}, Init::kOnes});
  if (!c.tie_word_embeddings) specs.push_back({"lm_head.weight", {vocab, hidden}, Init::kLinear});
  return specs;
}

uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

constexpr size_t kChunkElements = size_t{1} << 20;

// Fills elements [begin, end) of a bf16 tensor. Deterministic in (seed, name, chunk index).
void FillChunk(const TensorSpec& spec, float std_dev, uint64_t seed, size_t chunk, uint8_t* out) {
  const size_t begin = chunk * kChunkElements;
  const size_t end = std::min(spec.numel(), begin + kChunkElements);
  if (spec.init == Init::kOnes) {
    const uint16_t one = FloatToBf16(1.0f);
    for (size_t i = begin; i < end; ++i) std::memcpy(out + 2 * i, &one, 2);
    return;
  }
  uint64_t state = Mix64(Mix64(seed * 0x9e3779b97f4a7c15ull ^ HashName(spec.name)) ^
                         (chunk + 1) * 0xd1b54a32d192ed03ull);
  // Irwin-Hall: the sum of four 16-bit uniforms is close to normal; its std is 65536 / sqrt(3).
  const float scale = std_dev * std::sqrt(3.0f) / 65536.0f;
  for (size_t i = begin; i < end; ++i) {
    state += 0x9e3779b97f4a7c15ull;
    const uint64_t r = Mix64(state);
    const int64_t sum = static_cast<int64_t>((r & 0xffff) + ((r >> 16) & 0xffff) +
                                             ((r >> 32) & 0xffff) + (r >> 48)) -
                        2 * 65535;
    const uint16_t h = FloatToBf16(static_cast<float>(sum) * scale);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

float StdFor(Init init, int num_layers) {
  switch (init) {
    case Init::kLinear:
    case Init::kBias:
      return kInitStd;
    case Init::kResidualLinear:
      return kInitStd / std::sqrt(2.0f * static_cast<float>(num_layers));
    case Init::kOnes:
      return 0.0f;
  }
  return 0.0f;
}

// Generates every tensor of one shard on `threads` threads.
std::map<std::string, TensorToWrite> GenerateShard(const std::vector<const TensorSpec*>& specs,
                                                   int num_layers, uint64_t seed, int threads) {
  std::map<std::string, TensorToWrite> tensors;
  std::vector<std::pair<const TensorSpec*, uint8_t*>> chunks_of;  // one entry per chunk
  std::vector<size_t> chunk_index;
  for (const TensorSpec* spec : specs) {
    TensorToWrite& t = tensors[spec->name];
    t.dtype = DType::kBF16;
    t.shape = spec->shape;
    t.bytes.resize(spec->numel() * 2);
    const size_t n_chunks = (spec->numel() + kChunkElements - 1) / kChunkElements;
    for (size_t c = 0; c < n_chunks; ++c) {
      chunks_of.emplace_back(spec, t.bytes.data());
      chunk_index.push_back(c);
    }
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t k = next.fetch_add(1); k < chunks_of.size(); k = next.fetch_add(1)) {
      const TensorSpec* spec = chunks_of[k].first;
      FillChunk(*spec, StdFor(spec->init, num_layers), seed, chunk_index[k], chunks_of[k].second);
    }
  };
  std::vector<std::thread> workers;
  for (int t = 1; t < threads; ++t) workers.emplace_back(work);
  work();
  for (std::thread& w : workers) w.join();
  return tensors;
}

absl::Status WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::PermissionDeniedError(absl::StrCat("cannot create ", path.string()));
  out << text;
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat("error writing ", path.string()));
  return absl::OkStatus();
}

absl::Status CopyInto(const std::string& from, const fs::path& to) {
  std::error_code ec;
  if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) return absl::OkStatus();
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot copy ", from, " to ", to.string(), ": ", ec.message()));
  }
  return absl::OkStatus();
}

std::string GiB(size_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

absl::StatusOr<Tokenizer> TokenizerFor(const SynthOptions& options) {
  if (options.tokenizer_path.empty()) return BuildDefaultTokenizer();
  return LoadUserTokenizer(options.tokenizer_path);
}

}  // namespace

std::vector<std::string> SynthModelNames() {
  return {"tiny", "llama-3.2-1b", "llama-3-8b", "llama-3.1-8b", "qwen2.5-7b"};
}

absl::StatusOr<ModelConfig> SynthConfigFor(const std::string& like) {
  const Tokenizer tok = BuildDefaultTokenizer();
  ASSIGN_OR_RETURN(Json c, ConfigJson(like, tok, like == "tiny"));
  return ParseModelConfig(c.dump(), "synth " + like);
}

absl::Status SynthesizeModel(const SynthOptions& options, std::ostream* progress) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (options.out_dir.empty()) return absl::InvalidArgumentError("synth: no output directory");
  ASSIGN_OR_RETURN(Tokenizer tok, TokenizerFor(options));
  const bool vocab_from_tokenizer = options.like == "tiny" || !options.tokenizer_path.empty();
  ASSIGN_OR_RETURN(Json config_json, ConfigJson(options.like, tok, vocab_from_tokenizer));
  ASSIGN_OR_RETURN(ModelConfig config,
                   ParseModelConfig(config_json.dump(), "synth " + options.like));

  const fs::path dir(options.out_dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir, ec)) {
    return absl::PermissionDeniedError(
        absl::StrCat("cannot create directory ", options.out_dir, ": ", ec.message()));
  }

  RETURN_IF_ERROR(WriteText(dir / "config.json", config_json.dump(2) + "\n"));
  Json generation = {{"_from_model_config", true}, {"transformers_version", "4.45.0"}};
  if (tok.bos_id >= 0) generation["bos_token_id"] = tok.bos_id;
  if (!tok.eos_ids.empty()) generation["eos_token_id"] = EosJson(tok.eos_ids);
  RETURN_IF_ERROR(WriteText(dir / "generation_config.json", generation.dump(2) + "\n"));
  if (options.tokenizer_path.empty()) {
    RETURN_IF_ERROR(WriteText(dir / "tokenizer.json", tok.tokenizer_json.dump(2) + "\n"));
    RETURN_IF_ERROR(WriteText(dir / "tokenizer_config.json", tok.tokenizer_config.dump(2) + "\n"));
  } else {
    RETURN_IF_ERROR(CopyInto(options.tokenizer_path, dir / "tokenizer.json"));
    if (!tok.tokenizer_config_source.empty()) {
      RETURN_IF_ERROR(CopyInto(tok.tokenizer_config_source, dir / "tokenizer_config.json"));
    } else if (progress != nullptr) {
      *progress << "synth: no tokenizer_config.json beside " << options.tokenizer_path
                << "; the model directory has no chat template\n";
    }
  }

  // Plan shards: tensors in order, a new shard when the next tensor would overflow this one.
  const size_t max_shard = options.max_shard_bytes != 0 ? options.max_shard_bytes
                           : options.like == "tiny"     ? kTinyShardBytes
                                                        : kDefaultShardBytes;
  const std::vector<TensorSpec> specs = TensorSpecs(config);
  std::vector<std::vector<const TensorSpec*>> shards(1);
  size_t shard_bytes = 0, total_bytes = 0, total_params = 0;
  for (const TensorSpec& spec : specs) {
    const size_t bytes = spec.numel() * 2;
    if (shard_bytes > 0 && shard_bytes + bytes > max_shard) {
      shards.emplace_back();
      shard_bytes = 0;
    }
    shards.back().push_back(&spec);
    shard_bytes += bytes;
    total_bytes += bytes;
    total_params += spec.numel();
  }
  const int threads = options.num_threads > 0
                          ? options.num_threads
                          : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (progress != nullptr) {
    *progress << absl::StrFormat("synth %s: %d parameters, %s bf16 in %d shards -> %s\n",
                                 options.like, total_params, GiB(total_bytes), shards.size(),
                                 options.out_dir);
  }

  // Generate shard k+1 while shard k is written.
  Json weight_map = Json::object();
  absl::Status write_status;
  std::thread writer;
  std::map<std::string, TensorToWrite> writing;
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file =
        absl::StrFormat("model-%05d-of-%05d.safetensors", s + 1, shards.size());
    for (const TensorSpec* spec : shards[s]) weight_map[spec->name] = file;
    std::map<std::string, TensorToWrite> generated =
        GenerateShard(shards[s], config.num_layers, options.seed, threads);
    if (writer.joinable()) writer.join();
    RETURN_IF_ERROR(write_status);
    writing = std::move(generated);
    const std::string path = (dir / file).string();
    writer = std::thread([&writing, &write_status, path, progress, start, s, &shards] {
      write_status = WriteSafetensors(path, writing);
      if (progress != nullptr && write_status.ok()) {
        const double secs = std::chrono::duration<double>(Clock::now() - start).count();
        *progress << absl::StrFormat("synth: wrote %s (%d/%d, %.1f s)\n", path, s + 1,
                                     shards.size(), secs);
      }
    });
  }
  if (writer.joinable()) writer.join();
  RETURN_IF_ERROR(write_status);

  Json index = {{"metadata", {{"total_size", total_bytes}}}, {"weight_map", weight_map}};
  RETURN_IF_ERROR(WriteText(dir / "model.safetensors.index.json", index.dump(2) + "\n"));
  return absl::OkStatus();
}

}  // namespace tandem
