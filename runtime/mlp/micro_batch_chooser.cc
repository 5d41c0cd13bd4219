#include "runtime/mlp/micro_batch_chooser.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tandem::mlp {

absl::Status MicroBatchChooser::Validate(const MicroBatchChooserOptions& options) {
  if (options.candidates.empty()) {
    return absl::InvalidArgumentError("micro-batch chooser: no candidate count");
  }
  for (size_t i = 0; i < options.candidates.size(); ++i) {
    if (options.candidates[i] < 1 ||
        (i > 0 && options.candidates[i] <= options.candidates[i - 1])) {
      return absl::InvalidArgumentError(
          "micro-batch chooser: candidates must be ascending counts of at least 1");
    }
  }
  if (options.probe_steps < 1 || options.reprobe_after < 1) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch chooser: probe_steps ",
                                                   options.probe_steps, ", reprobe_after ",
                                                   options.reprobe_after));
  }
  return absl::OkStatus();
}

MicroBatchChooser::MicroBatchChooser(MicroBatchChooserOptions options)
    : options_(std::move(options)) {}

int MicroBatchChooser::BucketOf(int rows) {
  int b = 1;
  while (b < rows && b < (1 << 30)) b <<= 1;
  return b;
}

std::vector<int> MicroBatchChooser::Usable(int rows) const {
  std::vector<int> usable;
  for (int c : options_.candidates) {
    if (c <= rows) usable.push_back(c);
  }
  if (usable.empty()) usable.push_back(1);
  return usable;
}

int MicroBatchChooser::Choose(int rows) {
  rows = std::max(rows, 1);
  Bucket& b = buckets_[BucketOf(rows)];
  const std::vector<int> usable = Usable(rows);
  if (b.decided.has_value()) return std::min(*b.decided, usable.back());
  // Probing: the usable candidate with the fewest samples (the first of them on a tie).
  int best = usable.front();
  size_t fewest = b.samples[best].size();
  for (int c : usable) {
    if (b.samples[c].size() < fewest) {
      best = c;
      fewest = b.samples[c].size();
    }
  }
  return best;
}

std::optional<int> MicroBatchChooser::Record(int rows, int micro_batches, double ms) {
  rows = std::max(rows, 1);
  Bucket& b = buckets_[BucketOf(rows)];
  if (b.decided.has_value()) {
    if (++b.decided_steps >= options_.reprobe_after) {
      b.decided.reset();
      b.decided_steps = 0;
      b.samples.clear();
    }
    return std::nullopt;
  }
  b.samples[micro_batches].push_back(ms / rows);
  // Decided once every candidate usable at this bucket's size has its samples.
  const std::vector<int> usable = Usable(BucketOf(rows));
  int best = 0;
  double best_median = 0;
  for (int c : usable) {
    std::vector<double>& s = b.samples[c];
    if (static_cast<int>(s.size()) < options_.probe_steps) {
      // A candidate above this step's rows may never be sampled in this bucket: judge without it.
      if (c > rows) continue;
      return std::nullopt;
    }
    std::vector<double> sorted = s;
    std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
    const double median = sorted[sorted.size() / 2];
    if (best == 0 || median < best_median) {
      best = c;
      best_median = median;
    }
  }
  if (best == 0) return std::nullopt;
  b.decided = best;
  b.decided_steps = 0;
  return best;
}

std::optional<int> MicroBatchChooser::Decided(int rows) const {
  auto it = buckets_.find(BucketOf(std::max(rows, 1)));
  if (it == buckets_.end()) return std::nullopt;
  return it->second.decided;
}

}  // namespace tandem::mlp
