#include "runtime/mlp/micro_batch_chooser.h"

#include <gtest/gtest.h>

#include <map>

namespace tandem::mlp {
namespace {

// Runs steps of `rows` rows through the chooser, each timed by `ms_of(count)`, until it decides;
// returns the decision and how many steps each count got.
template <typename F>
std::pair<int, std::map<int, int>> Probe(MicroBatchChooser& chooser, int rows, F ms_of) {
  std::map<int, int> steps;
  for (int i = 0; i < 100; ++i) {
    const int m = chooser.Choose(rows);
    EXPECT_LE(m, rows);
    ++steps[m];
    if (std::optional<int> d = chooser.Record(rows, m, ms_of(m)); d.has_value()) {
      return {*d, steps};
    }
  }
  ADD_FAILURE() << "no decision in 100 steps";
  return {0, steps};
}

TEST(MicroBatchChooserTest, KeepsTheFasterCountPerBatchSize) {
  MicroBatchChooser chooser;
  // Batch 64: two micro-batches hide the round trip.
  auto [d64, steps64] = Probe(chooser, 64, [](int m) { return m == 2 ? 9.0 : 10.0; });
  EXPECT_EQ(d64, 2);
  EXPECT_EQ(steps64[1], 3);
  EXPECT_EQ(steps64[2], 3);
  // Batch 4: splitting costs.
  auto [d4, steps4] = Probe(chooser, 4, [](int m) { return m == 2 ? 3.0 : 2.0; });
  EXPECT_EQ(d4, 1);
  // The decisions hold per bucket (rows rounded up to a power of two).
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(chooser.Choose(50), 2);
    chooser.Record(50, 2, 9.0);
    EXPECT_EQ(chooser.Choose(3), 1);
    chooser.Record(3, 1, 2.0);
  }
  EXPECT_EQ(chooser.Decided(33), 2);
  EXPECT_EQ(chooser.Decided(128), std::nullopt);
}

TEST(MicroBatchChooserTest, TheMedianIgnoresOneSlowOutlier) {
  MicroBatchChooser chooser;
  int calls_of_two = 0;
  auto [d, steps] = Probe(chooser, 16, [&](int m) {
    if (m == 1) return 10.0;
    return ++calls_of_two == 1 ? 500.0 : 8.0;  // one descheduled step
  });
  EXPECT_EQ(d, 2);
}

TEST(MicroBatchChooserTest, TiesGoToFewerMicroBatches) {
  MicroBatchChooser chooser;
  EXPECT_EQ(Probe(chooser, 32, [](int) { return 5.0; }).first, 1);
}

TEST(MicroBatchChooserTest, TimesAreComparedPerRow) {
  // A bucket holds steps of different sizes (33-64 rows): the per-row time decides, so the
  // larger steps of one count do not count against it.
  MicroBatchChooser chooser;
  std::optional<int> decided;
  for (int i = 0; i < 20 && !decided.has_value(); ++i) {
    const int m = chooser.Choose(64);
    const int rows = m == 1 ? 64 : 40;
    // 0.15 ms a row with one micro-batch, 0.2 with two: two look faster per step, not per row.
    decided = chooser.Record(rows, m, rows * (m == 1 ? 0.15 : 0.2));
  }
  EXPECT_EQ(decided, 1);
}

TEST(MicroBatchChooserTest, ProbesAgainAfterReprobeSteps) {
  MicroBatchChooser chooser({.candidates = {1, 2}, .probe_steps = 2, .reprobe_after = 5});
  EXPECT_EQ(Probe(chooser, 8, [](int m) { return m == 1 ? 1.0 : 2.0; }).first, 1);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(chooser.Choose(8), 1);
    chooser.Record(8, 1, 1.0);
  }
  EXPECT_EQ(chooser.Decided(8), std::nullopt);  // probing again: the load changed
  EXPECT_EQ(Probe(chooser, 8, [](int m) { return m == 1 ? 3.0 : 2.0; }).first, 2);
}

TEST(MicroBatchChooserTest, NeverMoreMicroBatchesThanRows) {
  MicroBatchChooser chooser({.candidates = {1, 2, 4}});
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(chooser.Choose(1), 1);
    chooser.Record(1, 1, 1.0);
  }
  EXPECT_EQ(chooser.Decided(1), 1);
  // Bucket 4 with steps of 3 rows: 4 micro-batches are never handed out, nor waited for.
  auto [d, steps] = Probe(chooser, 3, [](int m) { return 3.0 - m * 0.1; });
  EXPECT_EQ(d, 2);
  EXPECT_EQ(steps.count(4), 0u);
}

TEST(MicroBatchChooserTest, OptionsAreChecked) {
  EXPECT_TRUE(MicroBatchChooser::Validate({}).ok());
  EXPECT_FALSE(MicroBatchChooser::Validate({.candidates = {}}).ok());
  EXPECT_FALSE(MicroBatchChooser::Validate({.candidates = {2, 1}}).ok());
  EXPECT_FALSE(MicroBatchChooser::Validate({.candidates = {0, 1}}).ok());
  EXPECT_FALSE(MicroBatchChooser::Validate({.candidates = {1, 2}, .probe_steps = 0}).ok());
  EXPECT_FALSE(MicroBatchChooser::Validate({.candidates = {1}, .reprobe_after = 0}).ok());
}

}  // namespace
}  // namespace tandem::mlp
