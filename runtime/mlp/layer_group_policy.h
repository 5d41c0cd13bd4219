#pragma once
// When a GPU shard queues a layer's group of calls from several attention workers (sessions) as
// one GEMM (cuda/ipc_layer_batcher.h, docs/mlp.md "GPU data plane"): host-only, so its rules
// are tested without a GPU.
//
// A group at layer L may be queued when no other active session can still join it in time:
//   - kFull:   it holds max_rows rows;
//   - kAll:    every other session is idle (no call within `idle`), or in the group, or has
//              already asked for a layer >= L (it is ahead, or was served at L already: it
//              comes back to L only in its next step);
//   - kWindow: a session behind L (its last call was an earlier layer) is still active, but the
//              group has waited `window` since it opened.
// Otherwise kWait: waiting lets the session behind catch up, after which the two workers' calls
// of each layer arrive together.

#include <map>
#include <vector>

#include "absl/time/time.h"

namespace tandem::mlp {

struct LayerGroupPolicy {
  absl::Duration window = absl::Milliseconds(2);
  absl::Duration idle = absl::Milliseconds(20);
  int max_rows = 16384;
};

struct GroupSession {
  int last_layer = -1;  // the layer of its last call
  absl::Time last_call = absl::InfinitePast();
};

enum class GroupReady { kWait, kFull, kAll, kWindow };

// `members`: the sessions with a call in the group; `rows`: its rows; `opened`: its first call.
GroupReady GroupReadiness(const LayerGroupPolicy& policy, int layer,
                          const std::vector<int>& members, int rows, absl::Time opened,
                          const std::map<int, GroupSession>& sessions, absl::Time now);

}  // namespace tandem::mlp
