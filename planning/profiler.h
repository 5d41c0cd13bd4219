#pragma once
// Measures a DeviceProfile (profile.h) on this machine: the runner's forward passes as the engine
// would issue them, and KV transfers between two agents of one backend in this process.
//
// - Prefill: one prompt of each length, in chunks of at most max_num_batched_tokens (as the
//   engine schedules it), timed as a whole; with a prefix hit, only the uncached part (its start
//   position past the hit).
// - Batched prefill: `prompts` prompts of prefill_batch_tokens tokens each, nothing cached, in
//   one step (a prefill worker batches every queued prompt; wider GEMMs use the device better,
//   and the planner prices a step of many prompts with it).
// - Decode: `batch` one-token chunks at position `context`. The KV those positions attend to is
//   whatever the cache holds: the time of a step does not depend on the values, so no prompt is
//   prefilled first. Points whose blocks do not fit the cache are left out (and reported).
// - Transfer: a prompt's KV as the handoff moves it (one copy per layer, K or V, and block)
//   between two agents of the backend in this process, post to landed. Backends that need two
//   processes or devices (cuda_ipc, nccl) are refused with InvalidArgument.
// Each point is the median of `repeats` runs after one warm-up run.
// - Neighbours: other runners of the same model (options.neighbours), each on a thread of its
//   own repeating the point being measured, as the other workers of a full host would. A served
//   host is not idle: on a 2-core VM a bare forward pass measured alone ran about 20% faster
//   than the same pass inside `tandem serve`, whose router, gRPC threads and clients shared the
//   other core (bench/RESULTS.md). Their count is recorded in the profile; transfer points run
//   without them.
// Thread-compatible: Profile runs on the calling thread, which owns the runner meanwhile (and
// the neighbours, through threads it starts and joins).

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "planning/profile.h"
#include "runtime/model/model_runner.h"

namespace tandem::planning {

struct ProfilerOptions {
  std::vector<int> prompt_lens = {16, 64, 128, 256, 512, 1024};
  std::vector<int> batch_sizes = {1, 2, 4, 8, 16, 32};
  std::vector<int> contexts = {64, 256, 1024};
  int max_num_batched_tokens = 512;
  std::vector<int> prefill_batch_prompts = {2, 4, 8};  // empty: no batched prefill points
  int prefill_batch_tokens = 128;
  int repeats = 5;
  std::string transfer_backend = "loopback";  // "" or "none": no transfer points
  uint64_t seed = 1;
  std::vector<ModelRunner*> neighbours;  // not owned; see above
};

// Called after each measured point: (points done, points in all, what was just measured).
using ProfileProgress = std::function<void(int done, int total, const std::string& what)>;

// InvalidArgument for bad options (empty or unsorted grids, lengths past the model's context),
// or the runner's and backend's errors. `profile.model`, `device`, `host` and `date` are the
// caller's to fill.
absl::StatusOr<DeviceProfile> MeasureProfile(ModelRunner& runner, const ProfilerOptions& options,
                                             const ProfileProgress& progress = nullptr);

}  // namespace tandem::planning
