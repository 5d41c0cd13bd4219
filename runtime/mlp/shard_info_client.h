#pragma once
// What an attention worker asks of every MLP shard before using it, for each client of the shards
// (the remote backend over gRPC, the cuda_ipc backend over the GPU data plane): its Info, fetched
// with retries until the shard answers or `give_up` passes, and checked against the worker's model
// (mlp_shard_checks.h); and which of the model's layers a set of shards leaves unserved.
//
// Errors name `who` (the backend) and the shard's address: Unavailable when no answer came in time
// (or UNAUTHENTICATED, at once), FailedPrecondition for another model or shape.
//
// Thread-safety: reentrant (blocks the calling thread for up to `give_up`).

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/mlp/mlp_backend.h"
#include "tandem/v1/mlp.grpc.pb.h"

namespace tandem::mlp {

// The shard's checked Info; `served` is its layer range.
absl::StatusOr<tandem::v1::MlpInfo> FetchShardInfo(tandem::v1::MlpShard::Stub& stub,
                                                   const std::string& address,
                                                   const MlpShape& expected,
                                                   const std::string& model_fingerprint,
                                                   absl::Time give_up, const std::string& who,
                                                   MlpShape* served);

// The layers of `expected` that none of `served` covers (empty: every layer is served).
std::vector<int> UnservedLayers(const MlpShape& expected, const std::vector<MlpShape>& served);

}  // namespace tandem::mlp
