#include "runtime/mlp/layer_group_policy.h"

#include <algorithm>

namespace tandem::mlp {

GroupReady GroupReadiness(const LayerGroupPolicy& policy, int layer,
                          const std::vector<int>& members, int rows, absl::Time opened,
                          const std::map<int, GroupSession>& sessions, absl::Time now) {
  if (rows >= policy.max_rows) return GroupReady::kFull;
  for (const auto& [id, s] : sessions) {
    const bool member = std::find(members.begin(), members.end(), id) != members.end();
    if (member || now - s.last_call > policy.idle || s.last_layer >= layer) continue;
    // An active session behind this layer: worth waiting for, within the window.
    return now >= opened + policy.window ? GroupReady::kWindow : GroupReady::kWait;
  }
  return GroupReady::kAll;
}

}  // namespace tandem::mlp
