#pragma once
// RemoteMlpBackend ("remote:ADDR[,ADDR...]"): the MlpBackend interface over `tandem mlp-shard`
// services (mlp_shard_service.h, proto/tandem/v1/mlp.proto).
//
// - Creation asks every shard for its Info (retrying until connect_timeout while shards start)
//   and checks it against the attention worker's model: the same fingerprint, hidden and
//   intermediate sizes, and together the shards must serve every layer of `expected`. Any
//   mismatch is FailedPrecondition naming the shard; an unreachable shard is Unavailable.
// - Submit sends the layer's rows to a shard serving it (round robin among those not backing
//   off) as one async unary call with deadline min(deadline, now + call_timeout); Wait waits for
//   that call alone.
// - A call that fails (error, deadline, an answer of the wrong size) puts its shard in a backoff
//   that doubles from backoff_initial to backoff_max while it keeps failing, and the layer is
//   retried on another shard serving it, then on the fallback backend (when given: the `cpu`
//   backend, with the weights still in this process). Only when neither is left does Wait fail:
//   Unavailable (DeadlineExceeded past the deadline), naming the layer and the shards tried.
//   A shard in backoff is skipped, so a dead or frozen shard costs at most one call_timeout per
//   backoff; when every shard of a layer is backing off and there is no fallback, Submit fails
//   the call at once instead of waiting.
// - Every call presents the deployment's service credential (auth::ServiceIdentity). Answers
//   are untrusted: only an output of exactly rows x hidden float32 is copied out.
//
// Thread-compatible (the engine thread); gRPC completes calls on its own threads.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/mlp/remote_mlp_options.h"
#include "tandem/v1/mlp.grpc.pb.h"

namespace tandem::mlp {

class RemoteMlpBackend final : public MlpBackend {
 public:
  static absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> Create(
      const std::vector<std::string>& addresses,
      std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
      const std::string& model_fingerprint, std::unique_ptr<MlpBackend> fallback,
      const RemoteMlpOptions& options = {});
  ~RemoteMlpBackend() override;

  std::string_view name() const override { return "remote"; }
  MlpShape shape() const override { return expected_; }
  absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                absl::Time deadline) override;
  absl::Status Wait(Handle handle) override;
  bool asynchronous() const override { return true; }
  int64_t resident_weight_bytes() const override {
    return fallback_ != nullptr ? fallback_->resident_weight_bytes() : 0;
  }
  MlpBackendStats stats() const override { return stats_; }

 private:
  struct Shard {
    std::string address;
    std::unique_ptr<tandem::v1::MlpShard::Stub> stub;
    MlpShape shape;
    absl::Time retry_at = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
  };
  // One RPC. Owned by the backend (Pending, then abandoned_ if a Wait gives up on it) until its
  // callback has run: the callback only marks it done, so no ClientContext is ever destroyed
  // on gRPC's callback thread, and the destructor waits for every callback before the stubs go.
  struct Call {
    grpc::ClientContext context;
    tandem::v1::MlpComputeRequest request;
    tandem::v1::MlpComputeResponse response;
    absl::Mutex mu;
    bool done ABSL_GUARDED_BY(mu) = false;
    grpc::Status status ABSL_GUARDED_BY(mu);
  };
  struct Pending {
    int layer = 0;
    const float* x = nullptr;
    int rows = 0;
    float* out = nullptr;
    absl::Time deadline;
    std::vector<size_t> tried;  // shards, in order; the last one has `call` in flight
    std::shared_ptr<Call> call;
    bool on_fallback = false;  // computed by the fallback at Submit (its handle below)
    Handle fallback_handle = 0;
  };

  RemoteMlpBackend(std::vector<Shard> shards, const MlpShape& expected,
                   std::unique_ptr<MlpBackend> fallback, const RemoteMlpOptions& options);
  // A shard serving `layer`, not in `tried`, not backing off at `now`; -1 when none.
  int PickShard(int layer, const std::vector<size_t>& tried, absl::Time now);
  void StartCall(Pending& p, size_t shard, absl::Time now);
  void Failed(size_t shard, absl::Time now);
  // Drops abandoned calls whose callbacks have run.
  void Reap();
  void Succeeded(size_t shard);

  std::vector<Shard> shards_;
  const MlpShape expected_;
  const std::unique_ptr<MlpBackend> fallback_;
  const RemoteMlpOptions options_;
  absl::flat_hash_map<Handle, Pending> pending_;
  std::vector<std::shared_ptr<Call>> abandoned_;  // given up on, callback not run yet
  Handle next_ = 1;
  size_t round_robin_ = 0;
  MlpBackendStats stats_;
};

}  // namespace tandem::mlp
