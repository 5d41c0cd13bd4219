#pragma once
// The checks on tandem.v1.MlpShard messages (proto/tandem/v1/mlp.proto) that come from another
// process: the shard's on every Compute call, the attention worker's on a shard's Info and on
// every answer. Pure functions, so the fuzzer (fuzz/worker_proto_fuzz.cc) runs exactly them.
//
// Thread-safety: pure functions.

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "runtime/mlp/mlp_backend.h"
#include "tandem/v1/mlp.pb.h"

namespace tandem::mlp {

// A Compute call a shard serving `shape` accepts: a layer it serves, rows in 1..max_rows, and
// activations of exactly rows x hidden_size float32 (without a session; no slot then), or none
// (with a session: the session's own check, ShardHostSession::Claim, bounds slot and rows).
// InvalidArgument naming the field otherwise.
absl::Status CheckComputeRequest(const tandem::v1::MlpComputeRequest& request,
                                 const MlpShape& shape, int max_rows);

// The bytes an accepted call's rows take (and its answer must have).
size_t ComputeBytes(int rows, const MlpShape& shape);

// A shard's Info as an attention worker of `expected` (its fingerprint unless empty) takes it:
// the same hidden and intermediate sizes and a non-empty layer range inside the model.
// FailedPrecondition naming the difference; on success `served` is the shard's range.
absl::Status CheckShardInfo(const tandem::v1::MlpInfo& info, const MlpShape& expected,
                            const std::string& model_fingerprint, MlpShape* served);

// The bytes of a cudaIpcMemHandle_t and of a cudaIpcEventHandle_t (checked against CUDA's
// headers where they are used).
inline constexpr size_t kIpcHandleBytes = 64;

// An Attach request a shard with `max_rows` per call accepts: max_rows in 1..max_rows, a GPU
// UUID of 32 lowercase hex digits, and a boot id of 1..64 printable characters. InvalidArgument
// naming the field otherwise.
absl::Status CheckAttachRequest(const tandem::v1::MlpAttachRequest& request, int max_rows);

// A shard's Attach answer as a client that asked for `rows` rows takes it: three handles of
// kIpcHandleBytes, a doorbell name of the doorbell's form, and max_rows equal to `rows`.
// InvalidArgument naming the field otherwise.
absl::Status CheckAttachResponse(const tandem::v1::MlpAttachResponse& response, int rows);

// The host data plane (AttachHost): bounds on what its messages carry.
inline constexpr size_t kMaxAgentBytes = 128;
inline constexpr size_t kMaxBlobBytes = 4096;  // an address or region blob of cma or ucx
inline constexpr uint32_t kMaxHostSlots = 16;

// An AttachHost request a shard with `max_rows` per call accepts: backend "cma" or "ucx", an
// agent of 1..kMaxAgentBytes printable characters, an address and an input region of
// 1..kMaxBlobBytes each, slots in 1..kMaxHostSlots, slot_rows in 1..max_rows. InvalidArgument
// naming the field otherwise. (The blobs' contents are the backend's to parse and bound.)
absl::Status CheckHostAttachRequest(const tandem::v1::MlpHostAttachRequest& request, int max_rows);

// A shard's AttachHost answer as a worker takes it: a session other than 0, an agent as above,
// an address and an output region of 1..kMaxBlobBytes each. InvalidArgument naming the field.
absl::Status CheckHostAttachResponse(const tandem::v1::MlpHostAttachResponse& response);

}  // namespace tandem::mlp
