// Token masks against the brute-force definition: token t is allowed in state s iff walking its
// bytes from s does not die.
#include "runtime/grammar/token_mask.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/grammar/byte_dfa.h"
#include "runtime/grammar/grammar_cache.h"
#include "runtime/grammar/mask_prefetcher.h"

namespace tandem::grammar {
namespace {

std::vector<std::string> RandomVocab(std::mt19937& rng, int size) {
  std::vector<std::string> vocab(size);
  for (int id = 0; id < size; ++id) {
    if (id % 97 == 0) continue;  // a special token: no bytes
    const int len = 1 + rng() % 4;
    for (int k = 0; k < len; ++k) vocab[id] += "ab-1é"[rng() % 6];
  }
  return vocab;
}

TEST(TokenMaskTest, EqualsBruteForceInEveryState) {
  std::mt19937 rng(7);
  const std::vector<std::string> vocab = RandomVocab(rng, 3000);
  for (const char* pattern : {"(ab|a-)*1", "[ab]{2,5}-?\\d", ".{0,3}é", "a+"}) {
    absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex(pattern);
    ASSERT_TRUE(dfa.ok()) << dfa.status();
    TokenMasker masker(&*dfa, vocab);
    for (int s = 0; s < dfa->num_states(); ++s) {
      const TokenBitmask mask = masker.ComputeMask(s);
      int allowed = 0;
      for (int id = 0; id < static_cast<int>(vocab.size()); ++id) {
        const bool want = !vocab[id].empty() && dfa->Walk(s, vocab[id]) != kDeadState;
        ASSERT_EQ(mask.Test(id), want)
            << pattern << " state " << s << " token " << id << " \"" << vocab[id] << "\"";
        allowed += want;
      }
      EXPECT_EQ(mask.Count(), allowed);
      // The cached mask is the same one, and the same object the second time.
      const std::shared_ptr<const TokenBitmask> cached = masker.Mask(s);
      EXPECT_EQ(cached->words(), mask.words());
      EXPECT_EQ(masker.Mask(s).get(), cached.get());
    }
  }
}

TEST(TokenMaskTest, AnAcceptingStateWithoutContinuationAllowsNoToken) {
  const std::vector<std::string> vocab = {"", "y", "es", "yes", "n", "o"};
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromChoices({"yes", "no"});
  ASSERT_TRUE(dfa.ok());
  TokenMasker masker(&*dfa, vocab);
  const TokenBitmask start = masker.ComputeMask(dfa->start());
  EXPECT_FALSE(start.Test(0));
  EXPECT_TRUE(start.Test(1) && start.Test(3) && start.Test(4));
  EXPECT_FALSE(start.Test(2) || start.Test(5));
  const int done = dfa->Walk(dfa->start(), "yes");
  EXPECT_EQ(masker.ComputeMask(done).Count(), 0);  // only EOS, which the caller adds
}

TEST(TokenMaskTest, TheCacheIsBoundedAndPastItMasksAreStillRight) {
  std::mt19937 rng(3);
  const std::vector<std::string> vocab = RandomVocab(rng, 500);
  absl::StatusOr<ByteDfa> dfa = ByteDfa::FromRegex("[ab]{0,12}1");
  ASSERT_TRUE(dfa.ok());
  ASSERT_GT(dfa->num_states(), 4);
  TokenMasker masker(&*dfa, std::make_shared<const VocabTrie>(vocab), /*max_cached=*/2);
  for (int round = 0; round < 2; ++round) {
    for (int s = 0; s < dfa->num_states(); ++s) {
      EXPECT_EQ(masker.Mask(s)->words(), masker.ComputeMask(s).words()) << s;
    }
  }
  // Two states are kept, the two most recently used.
  const int last = dfa->num_states() - 1;
  EXPECT_EQ(masker.Mask(last).get(), masker.Mask(last).get());
  const int64_t before = masker.computed();
  masker.Mask(0);  // evicts last - 1 (least recent), keeps last
  masker.Mask(last);
  EXPECT_EQ(masker.computed(), before + 1);
  masker.Mask(last - 1);  // evicted: computed again
  EXPECT_EQ(masker.computed(), before + 2);
  EXPECT_EQ(masker.Mask(last - 1)->words(), masker.ComputeMask(last - 1).words());
}

}  // namespace
}  // namespace tandem::grammar

namespace tandem::grammar {
namespace {

TEST(MaskPrefetcherTest, PrefetchedMasksAreComputedOnceAndRight) {
  std::mt19937 rng(5);
  const std::vector<std::string> vocab = RandomVocab(rng, 2000);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g = CompiledGrammar::Compile(
      "[ab]{0,40}(1|22)", {}, "", std::make_shared<const VocabTrie>(vocab));
  ASSERT_TRUE(g.ok()) << g.status();
  const TokenMasker& masker = (*g)->masker();
  const int states = dynamic_cast<const ByteDfa&>((*g)->automaton()).num_states();
  {
    MaskPrefetcher prefetcher;
    for (int s = 0; s < states; ++s) prefetcher.Prefetch(*g, s);
    // The engine's side: ask right away, racing the prefetcher; every answer is right.
    for (int s = 0; s < states; ++s) {
      ASSERT_EQ(masker.Mask(s)->words(), masker.ComputeMask(s).words()) << s;
    }
    EXPECT_EQ(prefetcher.dropped(), 0);
  }  // the destructor drains and joins
  EXPECT_EQ(masker.computed(), states) << "each state once, by whichever thread came first";
  for (int s = 0; s < states; ++s) EXPECT_TRUE(masker.CachedOrPending(s));
}

TEST(MaskPrefetcherTest, AFullQueueDropsRequestsAndNothingElse) {
  std::mt19937 rng(6);
  const std::vector<std::string> vocab = RandomVocab(rng, 300);
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> g =
      CompiledGrammar::Compile("[ab]{0,60}1", {}, "", std::make_shared<const VocabTrie>(vocab));
  ASSERT_TRUE(g.ok());
  MaskPrefetcher prefetcher(/*max_queued=*/1);
  for (int s = 0; s < dynamic_cast<const ByteDfa&>((*g)->automaton()).num_states(); ++s)
    prefetcher.Prefetch(*g, s);
  for (int s = 0; s < dynamic_cast<const ByteDfa&>((*g)->automaton()).num_states(); ++s) {
    ASSERT_EQ((*g)->masker().Mask(s)->words(), (*g)->masker().ComputeMask(s).words());
  }
  prefetcher.Prefetch(nullptr, 0);  // ignored
}

}  // namespace
}  // namespace tandem::grammar
