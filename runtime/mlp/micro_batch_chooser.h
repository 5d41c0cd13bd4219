#pragma once
// MicroBatchChooser: how many micro-batches a runner's offloaded step runs in ping-pong
// (docs/mlp.md, "Ping-pong"), chosen from the step times it measures rather than fixed. Splitting a
// step helps when one micro-batch's MLP round trip is long against another's attention (a shard
// across a link, or a busy one) and costs when it is short (smaller GEMMs, more launches and
// calls); which one holds depends on the batch size, the backend and the load, so it is measured
// per batch size.
//
// Per bucket of steps (rows rounded up to a power of two), the chooser probes: Choose() hands out
// each candidate count in turn (those above the step's rows are skipped) until each has
// `probe_steps` samples of the time per row Record() reports; then it keeps the candidate with
// the lowest median (ties: fewer micro-batches) for `reprobe_after` steps of that bucket, after
// which it probes again (the load may have changed). Candidates above a step's rows are neither
// handed out for it nor waited for.
//
// Thread-safety: one thread (the runner's).

#include <map>
#include <optional>
#include <vector>

#include "absl/status/status.h"

namespace tandem::mlp {

struct MicroBatchChooserOptions {
  std::vector<int> candidates = {1, 2};  // ascending, each >= 1
  int probe_steps = 3;                   // samples per candidate before a decision
  int reprobe_after = 4096;              // decided steps of a bucket before probing again
};

class MicroBatchChooser {
 public:
  // InvalidArgument for no candidate, an unsorted or non-positive one, or counts < 1.
  static absl::Status Validate(const MicroBatchChooserOptions& options);
  explicit MicroBatchChooser(MicroBatchChooserOptions options = {});

  // The micro-batch count for a step of `rows` rows (>= 1), never above `rows`.
  int Choose(int rows);
  // The measured wall time of a step of `rows` rows that ran in `micro_batches`. Returns the
  // bucket's decision when this sample completed the probe (for the caller's log), else nothing.
  std::optional<int> Record(int rows, int micro_batches, double ms);
  // The decision in force for steps of `rows` rows, if any.
  std::optional<int> Decided(int rows) const;

  // The bucket of a step of `rows` rows: the smallest power of two >= rows (steps of
  // BucketOf(rows) / 2 + 1 up to BucketOf(rows) rows share a decision).
  static int BucketOf(int rows);

 private:
  struct Bucket {
    std::map<int, std::vector<double>> samples;  // candidate -> ms per row
    std::optional<int> decided;
    int decided_steps = 0;
  };
  std::vector<int> Usable(int rows) const;

  MicroBatchChooserOptions options_;
  std::map<int, Bucket> buckets_;
};

}  // namespace tandem::mlp
