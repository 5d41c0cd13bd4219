#pragma once
// Tuning of the remote MLP backend (remote_mlp_backend.h; docs/tuning.md), apart from it so that
// the registry's users do not see gRPC.

#include "absl/time/time.h"

namespace tandem::mlp {

struct RemoteMlpOptions {
  absl::Duration call_timeout = absl::Seconds(2);      // one layer's call
  absl::Duration connect_timeout = absl::Seconds(30);  // Info at creation, every shard
  absl::Duration backoff_initial = absl::Milliseconds(200);
  absl::Duration backoff_max = absl::Seconds(10);
};

}  // namespace tandem::mlp
