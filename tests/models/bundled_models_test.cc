// The bundled default models (models/target, models/draft) load and generate on CPU through
// `tandem generate`, and agree with references recorded by Hugging Face `transformers` and
// `tokenizers` on the training host (tests/models/expected_greedy.json, written by
// tools/train/train.py): greedy token ids, prompt encodings and the ChatML rendering.
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

extern char** environ;

namespace tandem {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kSourceDir = TANDEM_SOURCE_DIR;
const fs::path kModelsDir = kSourceDir / "models";

struct RunResult {
  int exit_code = -1;
  std::string out;
};

// Runs TANDEM_BIN with `args` (no shell), capturing stdout; stderr passes through to the log.
RunResult RunTandem(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {TANDEM_BIN};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  int fds[2];
  RunResult r;
  if (pipe(fds) != 0) return r;
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return r;
  }
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) r.out.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

json ReadJson(const fs::path& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  if (!in.good()) return json();
  return json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// Parses the last non-empty line of `out` as JSON (null when it is not JSON).
json LastJsonLine(const std::string& out) {
  std::istringstream lines(out);
  std::string line;
  std::string last;
  while (std::getline(lines, line)) {
    if (!line.empty()) last = line;
  }
  return json::parse(last, nullptr, /*allow_exceptions=*/false);
}

std::vector<int> StripEos(std::vector<int> ids, const std::vector<int>& eos) {
  if (!ids.empty() && std::find(eos.begin(), eos.end(), ids.back()) != eos.end()) ids.pop_back();
  return ids;
}

// Parameter count of a model directory, from the safetensors headers alone.
int64_t CountParameters(const fs::path& dir) {
  int64_t total = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".safetensors") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), sizeof(header_len));
    std::string header(header_len, '\0');
    in.read(header.data(), static_cast<std::streamsize>(header_len));
    const json h = json::parse(header, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(h.is_object()) << entry.path();
    if (!h.is_object()) continue;
    for (const auto& [name, t] : h.items()) {
      if (name == "__metadata__") continue;
      EXPECT_EQ(t.at("dtype"), "BF16") << name;
      int64_t n = 1;
      for (const json& d : t.at("shape")) n *= d.get<int64_t>();
      total += n;
    }
  }
  return total;
}

TEST(BundledModels, DirectoriesAreWellFormedAndSmall) {
  uintmax_t total_bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(kModelsDir)) {
    if (entry.is_regular_file()) total_bytes += entry.file_size();
  }
  EXPECT_LT(total_bytes, 80u << 20);
  for (const char* name : {"target", "draft"}) {
    SCOPED_TRACE(name);
    const fs::path dir = kModelsDir / name;
    const json config = ReadJson(dir / "config.json");
    EXPECT_EQ(config.value("architectures", json::array()), json::array({"LlamaForCausalLM"}));
    EXPECT_EQ(config.value("torch_dtype", ""), "bfloat16");
    int shards = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".safetensors") continue;
      ++shards;
      EXPECT_LE(entry.file_size(), 15u << 20) << entry.path();
    }
    EXPECT_GE(shards, 1);
    if (shards > 1) {
      EXPECT_TRUE(fs::exists(dir / "model.safetensors.index.json"));
    }
    EXPECT_TRUE(fs::exists(dir / "tokenizer.json"));
    EXPECT_TRUE(fs::exists(dir / "generation_config.json"));
    const json tok_config = ReadJson(dir / "tokenizer_config.json");
    EXPECT_THAT(tok_config.value("chat_template", ""), ::testing::HasSubstr("<|im_start|>"));
    EXPECT_EQ(tok_config.value("bos_token", ""), "<|endoftext|>");
    EXPECT_EQ(tok_config.value("eos_token", ""), "<|im_end|>");
  }
  const int64_t target = CountParameters(kModelsDir / "target");
  const int64_t draft = CountParameters(kModelsDir / "draft");
  EXPECT_GE(target, 15'000'000);
  EXPECT_LE(target, 30'000'000);
  EXPECT_GE(draft, 1'000'000);
  EXPECT_LE(draft, 5'000'000);
}

class BundledModelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    expected_ = ReadJson(kSourceDir / "tests/models/expected_greedy.json");
    ASSERT_TRUE(expected_.is_object());
    ASSERT_TRUE(expected_["models"].contains(GetParam()));
    model_dir_ = (kModelsDir / GetParam()).string();
  }
  const json& Continuations() const { return expected_["models"][GetParam()]["continuations"]; }

  json expected_;
  std::string model_dir_;
};

TEST_P(BundledModelTest, PromptsEncodeLikeHfTokenizers) {
  for (const json& c : Continuations()) {
    const std::string prompt = c.at("prompt");
    SCOPED_TRACE(prompt);
    const RunResult r =
        RunTandem({"tokenize", "--model", model_dir_, "--json", "--add-special-tokens", prompt});
    ASSERT_EQ(r.exit_code, 0);
    const json j = LastJsonLine(r.out);
    ASSERT_TRUE(j.is_object()) << r.out;
    EXPECT_EQ(j.at("ids").get<std::vector<int>>(), c.at("prompt_ids").get<std::vector<int>>());
  }
}

TEST_P(BundledModelTest, ChatTemplateRendersLikeTheJinjaReference) {
  const json& chat = expected_.at("chat");
  const fs::path messages = fs::path(::testing::TempDir()) / ("chat_" + GetParam() + ".json");
  std::ofstream(messages) << chat.at("messages").dump();
  const RunResult r = RunTandem({"tokenize", "--model", model_dir_, "--chat", messages.string()});
  ASSERT_EQ(r.exit_code, 0);
  const json j = LastJsonLine(r.out);
  ASSERT_TRUE(j.is_object()) << r.out;
  EXPECT_EQ(j.at("text"), chat.at("rendered"));
  ASSERT_TRUE(j.at("ids").is_array() && !j.at("ids").empty());
  EXPECT_EQ(j.at("ids")[0], 0) << "the chat prompt starts with the BOS, as every training document";
}

// Mostly ASCII letters, spaces and ordinary punctuation.
bool LooksLikeEnglishText(const std::string& s) {
  int good = 0;
  for (unsigned char ch : s) {
    if (std::isalpha(ch) || ch == ' ' || ch == '\n' || std::strchr(".,;:'\"!?()-", ch) != nullptr) {
      ++good;
    }
  }
  return !s.empty() && good >= static_cast<int>(s.size()) * 9 / 10;
}

TEST_P(BundledModelTest, GreedyContinuationsMatchTransformersAndReadAsEnglish) {
  const int max_new = expected_.at("max_new_tokens");
  const std::vector<int> eos = expected_.at("eos_token_ids").get<std::vector<int>>();
  std::set<std::string> words;
  for (const json& c : Continuations()) {
    const std::string prompt = c.at("prompt");
    SCOPED_TRACE(prompt);
    const RunResult r = RunTandem({"generate", "--model", model_dir_, "--prompt", prompt,
                                   "--max-tokens", std::to_string(max_new), "--json"});
    ASSERT_EQ(r.exit_code, 0);
    const json j = LastJsonLine(r.out);
    ASSERT_TRUE(j.is_object()) << r.out;
    const std::vector<int> ids = j.at("token_ids").get<std::vector<int>>();
    EXPECT_EQ(StripEos(ids, eos), StripEos(c.at("token_ids").get<std::vector<int>>(), eos));
    const std::string text = j.at("text");
    EXPECT_EQ(text, c.at("text").get<std::string>());
    EXPECT_TRUE(LooksLikeEnglishText(text)) << text;
    std::string word;
    for (char ch : text + " ") {
      if (std::isalpha(static_cast<unsigned char>(ch))) {
        word += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
      } else if (!word.empty()) {
        words.insert(word);
        word.clear();
      }
    }
  }
  EXPECT_GE(words.size(), 20u);
  for (const char* common : {"the", "of", "is"}) EXPECT_TRUE(words.count(common)) << common;
}

INSTANTIATE_TEST_SUITE_P(TargetAndDraft, BundledModelTest, ::testing::Values("target", "draft"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
