#pragma once
// Tuning of the remote MLP backend (remote_mlp_backend.h; docs/tuning.md), apart from it so that
// the registry's users do not see gRPC.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer {
class TransferBackend;
}  // namespace tandem::kvtransfer

namespace tandem::mlp {

struct RemoteMlpOptions {
  absl::Duration call_timeout = absl::Seconds(2);      // one layer's call
  absl::Duration connect_timeout = absl::Seconds(30);  // Info at creation, every shard
  absl::Duration backoff_initial = absl::Milliseconds(200);
  absl::Duration backoff_max = absl::Seconds(10);
  // Shard discovery (`dns:NAME:PORT` entries): every `refresh` the names are resolved again (a
  // lookup waits at most `resolve_timeout`); a new address joins once its Info matches (asked
  // for at most `info_timeout`), one that left the answer is dropped.
  absl::Duration refresh = absl::Seconds(10);
  absl::Duration resolve_timeout = absl::Seconds(2);
  absl::Duration info_timeout = absl::Seconds(2);
  // How a call's rows travel (docs/mlp.md "Host data plane"): "grpc" inside the Compute
  // messages; "cma" (one host) or "ucx" (any) through the host data plane, each shard attached
  // with `plane_slots` slots of `plane_slot_rows` rows. A call of more rows, or with every slot
  // taken, goes in its message; a shard that refuses the plane is not used.
  std::string data_plane = "grpc";
  int plane_slots = 4;
  int plane_slot_rows = 256;
  // Tests: wraps the host data plane's transfer backend (fault injection); null: as created.
  std::function<std::unique_ptr<kvtransfer::TransferBackend>(
      std::unique_ptr<kvtransfer::TransferBackend>)>
      plane_wrap_backend;
  // Resolves a name to IP literals (NotFound: no such name); empty: the system's resolver.
  std::function<absl::StatusOr<std::vector<std::string>>(const std::string& host,
                                                         absl::Duration timeout)>
      resolver;
};

}  // namespace tandem::mlp
