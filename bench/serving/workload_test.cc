#include "bench/serving/workload.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/model/tokenizer.h"

namespace tandem::bench {
namespace {

int Words(const std::string& s) {
  return static_cast<int>(
      std::vector<absl::string_view>(absl::StrSplit(s, ' ', absl::SkipEmpty())).size());
}

TEST(ArrivalScheduleTest, PoissonMeanGapIsOneOverRate) {
  // Exponential gaps with rate 8/s: mean 0.125 s, std 0.125 s; over 20000 gaps the standard
  // error of the mean is 0.125/sqrt(20000) ~ 0.0009, so 1% tolerance is ~1.4 sigma... use 3%.
  ArrivalSchedule s(8.0, Arrival::kPoisson, 42);
  const int n = 20000;
  double first = s.Next();
  EXPECT_EQ(first, 0);
  double prev = first, last = 0;
  double sq = 0;
  for (int i = 0; i < n; ++i) {
    last = s.Next();
    ASSERT_GE(last, prev);
    sq += (last - prev) * (last - prev);
    prev = last;
  }
  const double mean = last / n;
  EXPECT_NEAR(mean, 0.125, 0.125 * 0.03);
  // Exponential: E[gap^2] = 2 / rate^2 (distinguishes it from constant spacing).
  EXPECT_NEAR(sq / n, 2.0 / 64.0, 2.0 / 64.0 * 0.1);
}

TEST(ArrivalScheduleTest, SameSeedSameSchedule) {
  ArrivalSchedule a(3.0, Arrival::kPoisson, 7), b(3.0, Arrival::kPoisson, 7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.Next(), b.Next());
}

TEST(ArrivalScheduleTest, ConstantAndBurst) {
  ArrivalSchedule c(4.0, Arrival::kConstant, 1);
  EXPECT_DOUBLE_EQ(c.Next(), 0);
  EXPECT_DOUBLE_EQ(c.Next(), 0.25);
  EXPECT_DOUBLE_EQ(c.Next(), 0.5);
  ArrivalSchedule burst(INFINITY, Arrival::kPoisson, 1);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(burst.Next(), 0);
}

TEST(SyntheticWorkloadTest, FixedLengthsInWords) {
  SyntheticSpec spec;
  spec.num_prompts = 20;
  spec.input_len = 33;
  spec.output_len = 7;
  std::vector<WorkItem> items = SyntheticWorkload(spec, nullptr);
  ASSERT_EQ(items.size(), 20u);
  for (const WorkItem& w : items) {
    EXPECT_EQ(Words(w.prompt), 33);
    EXPECT_EQ(w.input_len, 33);
    EXPECT_EQ(w.output_len, 7);
  }
  EXPECT_NE(items[0].prompt, items[1].prompt);
}

TEST(SyntheticWorkloadTest, SharedPrefixGroups) {
  SyntheticSpec spec;
  spec.num_prompts = 24;
  spec.input_len = 5;
  spec.output_len = 3;
  spec.prefix_groups = 3;
  spec.prefix_len = 40;
  std::vector<WorkItem> items = SyntheticWorkload(spec, nullptr);
  ASSERT_EQ(items.size(), 24u);
  std::map<std::string, int> per_prefix;
  std::set<std::string> suffixes;
  for (const WorkItem& w : items) {
    EXPECT_EQ(Words(w.prompt), 45);
    EXPECT_EQ(w.input_len, 45);
    std::vector<std::string> words = absl::StrSplit(w.prompt, ' ', absl::SkipEmpty());
    ++per_prefix[absl::StrJoin(words.begin(), words.begin() + 40, " ")];
    suffixes.insert(absl::StrJoin(words.begin() + 40, words.end(), " "));
  }
  EXPECT_EQ(per_prefix.size(), 3u);
  for (const auto& [prefix, n] : per_prefix) EXPECT_EQ(n, 8);
  EXPECT_EQ(suffixes.size(), 24u) << "every prompt has its own suffix";
  // Shuffled: the groups are not in round-robin order.
  bool interleaved_in_order = true;
  for (size_t i = 0; i + 3 < items.size(); ++i) {
    if (items[i].prompt.substr(0, 20) != items[i + 3].prompt.substr(0, 20)) {
      interleaved_in_order = false;
    }
  }
  EXPECT_FALSE(interleaved_in_order);
  // Same seed, same prompts.
  std::vector<WorkItem> again = SyntheticWorkload(spec, nullptr);
  for (size_t i = 0; i < items.size(); ++i) EXPECT_EQ(items[i].prompt, again[i].prompt);
}

TEST(SyntheticWorkloadTest, RangeRatioSpreadsUniformly) {
  SyntheticSpec spec;
  spec.num_prompts = 2000;
  spec.input_len = 100;
  spec.output_len = 100;
  spec.range_ratio = 0.5;
  std::vector<WorkItem> items = SyntheticWorkload(spec, nullptr);
  int lo = 1 << 30, hi = 0;
  double sum = 0;
  for (const WorkItem& w : items) {
    lo = std::min(lo, w.output_len);
    hi = std::max(hi, w.output_len);
    sum += w.output_len;
    EXPECT_EQ(Words(w.prompt), w.input_len);
  }
  EXPECT_EQ(lo, 50);
  EXPECT_EQ(hi, 150);
  EXPECT_NEAR(sum / items.size(), 100, 3);
}

// A small SentencePiece-style (Llama 2 like) tokenizer.json: letters, word pieces and merges,
// so decoding random ids and re-encoding them changes the count (merges join pieces).
std::string TinyTokenizerJson() {
  using json = nlohmann::json;
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\u2581", 3}};
  int next = 4;
  for (char c = 'a'; c <= 'z'; ++c) vocab[std::string(1, c)] = next++;
  json merges = json::array();
  for (const char* w : {"th", "he", "an", "in", "er"}) {
    vocab[w] = next++;
    merges.push_back(std::string(1, w[0]) + " " + std::string(1, w[1]));
  }
  for (const char* w : {"the", "in", "an"}) {
    vocab[std::string("\u2581") + w] = next++;
    merges.push_back(std::string("\u2581 ") + w);
  }
  vocab["the"] = next++;
  merges.push_back("th e");
  auto special = [](int id, const char* content) {
    return json{{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
                {"rstrip", false}, {"normalized", false}, {"special", true}};
  };
  json j = {
      {"added_tokens", json::array({special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array(
             {{{"type", "Prepend"}, {"prepend", "\u2581"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", true},
        {"byte_fallback", true},
        {"vocab", vocab},
        {"merges", merges}}}};
  return j.dump();
}

TEST(SyntheticWorkloadTest, ExactTokenCountsWithTokenizer) {
  const std::string dir = testing::TempDir() + "/bench_tiny_tokenizer";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tokenizer.json") << TinyTokenizerJson();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromModelDir(dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  SyntheticSpec spec;
  spec.num_prompts = 10;
  spec.input_len = 50;
  std::vector<WorkItem> items = SyntheticWorkload(spec, tok->get());
  ASSERT_EQ(items.size(), 10u);
  for (const WorkItem& w : items) {
    // The tokenizer is the reference: each prompt must encode to exactly --input-len tokens.
    EXPECT_EQ((*tok)->Encode(w.prompt, false).size(), 50u) << w.prompt;
    EXPECT_EQ(w.input_len, 50);
  }
  EXPECT_NE(items[0].prompt, items[1].prompt);
}

TEST(LoadDatasetTest, ReadsPromptsAndLengths) {
  const std::string path = testing::TempDir() + "/bench_dataset.jsonl";
  {
    std::ofstream f(path);
    f << R"({"prompt": "one two three", "output_len": 5})"
      << "\n\n"
      << R"({"prompt": "four", "max_tokens": 9, "input_len": 12})"
      << "\n"
      << R"({"prompt": "x y"})"
      << "\n";
  }
  absl::StatusOr<std::vector<WorkItem>> items = LoadDataset(path, 64, nullptr);
  ASSERT_TRUE(items.ok()) << items.status();
  ASSERT_EQ(items->size(), 3u);
  EXPECT_EQ((*items)[0].output_len, 5);
  EXPECT_EQ((*items)[0].input_len, 3);
  EXPECT_EQ((*items)[1].output_len, 9);
  EXPECT_EQ((*items)[1].input_len, 12);
  EXPECT_EQ((*items)[2].output_len, 64);
}

TEST(LoadDatasetTest, ErrorsNameTheLine) {
  const std::string path = testing::TempDir() + "/bench_bad.jsonl";
  {
    std::ofstream f(path);
    f << R"({"prompt": "ok"})"
      << "\n"
      << R"({"text": "no prompt"})"
      << "\n";
  }
  absl::StatusOr<std::vector<WorkItem>> items = LoadDataset(path, 64, nullptr);
  ASSERT_FALSE(items.ok());
  EXPECT_NE(items.status().message().find(":2:"), std::string::npos) << items.status();
  EXPECT_FALSE(LoadDataset(path + ".missing", 64, nullptr).ok());
}

}  // namespace
}  // namespace tandem::bench
