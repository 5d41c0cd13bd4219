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
// - Host data plane (options.data_plane "cma" or "ucx"; host_plane/worker_host_plane.h): each
//   shard is attached (AttachHost) when it is first used (at creation, or when discovery adds
//   it); a shard that refuses is an error at creation and not used when discovered. A call of
//   at most plane_slot_rows rows then takes a free slot of its shard's session: its rows go
//   into the slot, Compute names (session, slot), and once it returns the answer is read out of
//   the shard's slot (that read is part of the call: its failure is the call's, with the same
//   failover). A larger call, one finding every slot taken, or one to a shard whose session
//   ended travels in its message as above. A session that ended (the shard restarted, or its
//   call broke) is opened again on the backend's attach thread, at most once per
//   backoff_initial, never on the engine thread; calls use the new one once it is there.
// - Discovery: an address "dns:NAME:PORT" stands for every address NAME resolves to (a
//   Kubernetes headless Service: one per ready shard pod), resolved again every
//   options.refresh on a thread of the backend's own (runtime/router/discovery.h: a failed
//   lookup keeps the last answer; only "no such name" empties it). A new address joins once
//   its Info matches the model (asked for at most info_timeout; one that does not is logged
//   and asked again at the next refresh); an address that left the answer is dropped, its
//   calls in flight finishing on the channel they hold. At creation the shards found must
//   together serve every layer within connect_timeout. Later, a layer no shard serves any
//   more is a failed call (the fallback's, when there is one), never a wait.
//
// Thread-compatible (the engine thread); gRPC completes calls on its own threads, and the
// discovery thread publishes the shard set under a mutex that the engine thread reads at
// Submit.

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/auth/service_identity.h"
#include "runtime/mlp/host_plane/worker_host_plane.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/mlp/remote_mlp_options.h"
#include "tandem/v1/mlp.grpc.pb.h"

namespace tandem::mlp {

class RemoteMlpBackend final : public MlpBackend {
 public:
  // `addresses`: "HOST:PORT" or "dns:NAME:PORT" each.
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
  // One shard: its address, channel and layers (fixed), and its backoff (engine thread only).
  struct Shard {
    std::string address;
    std::unique_ptr<tandem::v1::MlpShard::Stub> stub;
    MlpShape shape;
    // The host data plane's session (engine thread; null: messages), and when it may next be
    // opened again after it ended.
    std::shared_ptr<WorkerHostSession> session;
    absl::Time reattach_at = absl::InfinitePast();
    bool session_lost_logged = false;
    // A session the attach thread opened again, for the engine thread to take.
    absl::Mutex mu;
    std::shared_ptr<WorkerHostSession> reopened ABSL_GUARDED_BY(mu);
    bool reattaching ABSL_GUARDED_BY(mu) = false;
    std::string reattach_error;  // the attach thread's last failure (logged when it changes)
    absl::Time retry_at = absl::InfinitePast();
    absl::Duration backoff = absl::ZeroDuration();
  };
  using ShardPtr = std::shared_ptr<Shard>;
  // One RPC. Owned by the backend (Pending, then abandoned_ if a Wait gives up on it) until its
  // callback has run: the callback only marks it done, so no ClientContext is ever destroyed
  // on gRPC's callback thread, and the destructor waits for every callback before the stubs go.
  // It holds its shard, so a shard dropped by discovery keeps its channel until then.
  struct Call {
    ShardPtr shard;
    // The session and slot holding the rows and the answer (slot -1: messages). The call holds
    // its session: the shard's may be replaced by a new one meanwhile.
    std::shared_ptr<WorkerHostSession> session;
    int slot = -1;
    int rows = 0;
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
    std::vector<ShardPtr> tried;  // in order; the last one has `call` in flight
    std::shared_ptr<Call> call;
    bool on_fallback = false;  // computed by the fallback at Submit (its handle below)
    Handle fallback_handle = 0;
  };
  // The shard set discovery publishes and the engine thread takes at Submit.
  struct Membership;

  static absl::StatusOr<std::unique_ptr<RemoteMlpBackend>> CreateDiscovering(
      const std::vector<std::string>& fixed, const std::vector<std::string>& names,
      std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
      const std::string& model_fingerprint, std::unique_ptr<MlpBackend> fallback,
      const RemoteMlpOptions& options, std::shared_ptr<WorkerHostPlane> plane);
  RemoteMlpBackend(std::vector<ShardPtr> shards, const MlpShape& expected,
                   std::unique_ptr<MlpBackend> fallback, const RemoteMlpOptions& options,
                   std::shared_ptr<Membership> membership, std::shared_ptr<WorkerHostPlane> plane);
  // Takes the latest shard set discovery published, if it changed.
  void TakeMembership();
  // A shard serving `layer`, not in `tried`, not backing off at `now`; null when none.
  ShardPtr PickShard(int layer, const std::vector<ShardPtr>& tried, absl::Time now);
  void StartCall(Pending& p, const ShardPtr& shard, absl::Time now);
  // The slot a call of `rows` to `shard` takes in its session (set in `session`); -1: the call
  // goes in messages. A session that ended is replaced by one the attach thread reopened, or
  // its reopening is asked for.
  int TakeSlot(const ShardPtr& shard, int rows, std::shared_ptr<WorkerHostSession>* session);
  // The attach thread: reopens the sessions of the shards queued in reattach_.
  void AttachLoop();
  // Frees a finished call's slot.
  static void FreeSlot(Call& call);
  void Failed(Shard& shard, absl::Time now);
  // Drops abandoned calls whose callbacks have run.
  void Reap();
  void Succeeded(Shard& shard);

  // First: destroyed after the shards' sessions, so their buffers retire on its thread.
  const std::shared_ptr<WorkerHostPlane> plane_;  // null: data_plane "grpc"
  std::vector<ShardPtr> shards_;
  const MlpShape expected_;
  const std::unique_ptr<MlpBackend> fallback_;
  const RemoteMlpOptions options_;
  const std::shared_ptr<Membership> membership_;  // null: a fixed set of addresses
  uint64_t membership_version_ = 0;
  // Shards whose session the attach thread is to reopen (attach_thread_ runs with a plane).
  struct AttachQueue {
    absl::Mutex mu;
    std::vector<ShardPtr> queued ABSL_GUARDED_BY(mu);
    bool stop ABSL_GUARDED_BY(mu) = false;
  };
  AttachQueue reattach_;
  std::thread attach_thread_;
  absl::flat_hash_map<Handle, Pending> pending_;
  std::vector<std::shared_ptr<Call>> abandoned_;  // given up on, callback not run yet
  Handle next_ = 1;
  size_t round_robin_ = 0;
  MlpBackendStats stats_;
};

}  // namespace tandem::mlp
