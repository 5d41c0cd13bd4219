// The n-gram drafter against a brute-force reference (the longest suffix n-gram with an earlier
// occurrence, its latest one), on random sequences over small alphabets (many matches); the
// corpus of released outputs; proposal lengths by match length; the registry's names.
#include "speculative/ngram_drafter.h"

#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "speculative/registry.h"

namespace tandem::speculative {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Brute force: the longest n in [lo, hi] whose suffix n-gram occurs ending at some e < len, the
// latest such e.
NgramIndex::Match Reference(const std::vector<int32_t>& t, int lo, int hi) {
  const int len = static_cast<int>(t.size());
  for (int n = std::min(hi, len); n >= lo; --n) {
    for (int e = len - 1; e >= n; --e) {
      if (std::equal(t.begin() + (e - n), t.begin() + e, t.end() - n)) return {n, e};
    }
  }
  return {};
}

TEST(NgramIndexTest, FindsTheLongestLatestMatchAsBruteForceDoes) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 300; ++trial) {
    const int alphabet = 2 + trial % 5;
    const int lo = 1 + trial % 3, hi = lo + trial % 6;
    NgramIndex index(lo, hi);
    std::vector<int32_t> t;
    for (int step = 0; step < 60; ++step) {
      t.push_back(static_cast<int32_t>(rng() % alphabet));
      index.Extend(t);  // incrementally, as a sequence grows
      const NgramIndex::Match got = index.Find(t, t);
      const NgramIndex::Match want = Reference(t, lo, hi);
      ASSERT_EQ(got.n, want.n) << "trial " << trial << " step " << step;
      if (want.n > 0) {
        ASSERT_EQ(got.end, want.end) << "trial " << trial << " step " << step;
      }
    }
  }
}

std::vector<int32_t> Propose(NgramDrafter& d, int64_t key, const std::vector<int32_t>& tokens,
                             int prompt, int max_tokens) {
  DraftRequest r;
  r.key = key;
  r.tokens = tokens;
  r.num_prompt_tokens = prompt;
  r.max_tokens = max_tokens;
  absl::StatusOr<std::vector<std::vector<int32_t>>> out = d.Propose({&r, 1}, absl::InfinitePast());
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() && out->size() == 1 ? (*out)[0] : std::vector<int32_t>{99999};
}

TEST(NgramDrafterTest, ProposesWhatFollowedTheMatchScaledByItsLength) {
  auto d = NgramDrafter::Create(NgramDrafterOptions{});
  ASSERT_TRUE(d.ok());
  // "... 5 6 7 8 9 10 11 ... 5 6": a 2-token match proposes up to 4 tokens.
  std::vector<int32_t> t = {1, 5, 6, 7, 8, 9, 10, 11, 2, 3, 5, 6};
  EXPECT_THAT(Propose(**d, 1, t, 4, 8), ElementsAre(7, 8, 9, 10));
  EXPECT_THAT(Propose(**d, 1, t, 4, 2), ElementsAre(7, 8));  // the request's cap
  t.push_back(7);  // a 3-token match now: up to 6, but only 4 tokens followed... then 2, 3
  EXPECT_THAT(Propose(**d, 1, t, 4, 8), ElementsAre(8, 9, 10, 11, 2, 3));
  const std::vector<int32_t> none = {1, 2, 3, 4, 5};
  EXPECT_TRUE(Propose(**d, 2, none, 2, 8).empty());
}

TEST(NgramDrafterTest, ReleasedOutputsFeedOtherSequences) {
  NgramDrafterOptions options;
  options.corpus_tokens = 64;
  auto d = NgramDrafter::Create(options);
  ASSERT_TRUE(d.ok());
  // Sequence 1's output 40 41 42 43 44 45 is released; sequence 2 ends with 40 41.
  const std::vector<int32_t> one = {1, 2, 40, 41, 42, 43, 44, 45};
  EXPECT_TRUE(Propose(**d, 1, one, 2, 4).empty());
  (*d)->Release(1, one, 2);
  EXPECT_EQ((*d)->corpus_size(), 7);  // the output and a separator
  const std::vector<int32_t> two = {9, 40, 41};
  EXPECT_THAT(Propose(**d, 2, two, 1, 8), ElementsAre(42, 43, 44, 45));  // stops at the end
  // The corpus keeps about corpus_tokens: old outputs go, at document boundaries.
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> filler(10, 1000 + i);
    filler.insert(filler.begin(), 7);
    (*d)->Release(100 + i, filler, 1);
    EXPECT_LE((*d)->corpus_size(), 2 * 64 + 11);
  }
  EXPECT_TRUE(Propose(**d, 3, two, 1, 8).empty());  // 40 41 42 ... was dropped
}

TEST(NgramDrafterTest, BadOptionsAndRegistry) {
  NgramDrafterOptions bad;
  bad.min_match = 3;
  bad.max_match = 2;
  EXPECT_FALSE(NgramDrafter::Create(bad).ok());
  absl::StatusOr<std::unique_ptr<Drafter>> ngram = CreateDrafter("ngram");
  ASSERT_TRUE(ngram.ok());
  EXPECT_EQ((*ngram)->name(), "ngram");
  absl::StatusOr<std::unique_ptr<Drafter>> unknown = CreateDrafter("eagle");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("choices: ngram"));
  // remote: needs the worker's service identity to call the drafters with.
  EXPECT_EQ(CreateDrafter("remote:10.0.0.1:9000").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::speculative
