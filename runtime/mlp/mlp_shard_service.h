#pragma once
// MlpShardService: tandem.v1.MlpShard (proto/tandem/v1/mlp.proto) over the MLP weights of one
// range of layers (`tandem mlp-shard`), for many attention workers (docs/mlp.md).
//
// - Batching: a Compute call is validated on its gRPC callback thread and queued with its
//   reactor; one compute thread takes everything queued, groups the calls by layer, and runs
//   each layer's rows (from every worker) as one MLP on its compute backend (the `cpu` backend,
//   dense_mlp.h, or `cuda` for `tandem mlp-shard --device cuda`), then answers each call with
//   its own rows. No thread waits per call. A compute error answers that batch's calls
//   INTERNAL with the backend's message.
// - Untrusted input: every call is authenticated first (UNAUTHENTICATED touches nothing); a
//   layer outside the range, rows outside 1..max_rows, or activations that are not exactly rows
//   x hidden_size float32 are INVALID_ARGUMENT naming the field. Addresses and lengths never
//   come from the wire: the shard reads only the message's own bytes, sized by its fields.
// - Deadlines: a call whose deadline passed before the compute thread reached it (or that was
//   cancelled) is answered DEADLINE_EXCEEDED (CANCELLED) without computing.
// - GPU data plane (Attach, mlp_shard_session.h): with a session factory (a shard on a GPU) an
//   authenticated, checked Attach gets one message with the session's handles and stays open;
//   the session is destroyed when the client ends the call, the call fails, or the shard stops.
//   Without a factory Attach is UNIMPLEMENTED; past max_sessions, RESOURCE_EXHAUSTED.
// - Host data plane (AttachHost, host_plane/shard_host_plane.h): with a host plane, an
//   authenticated, checked AttachHost opens a session the same way. A Compute call naming
//   (session, slot) is checked against the session (NOT_FOUND for an unknown session,
//   INVALID_ARGUMENT for a slot or row count outside it, FAILED_PRECONDITION while an earlier
//   call holds the slot), its rows are read out of the worker's slot (a failed read answers
//   UNAVAILABLE, a late one DEADLINE_EXCEEDED), computed in the same layer batches, and the
//   answer is left in the shard's output slot for the worker to read.
// - Shutdown (or destruction) answers what is queued with UNAVAILABLE, ends every session and
//   stops the thread.
//
// Threading: gRPC callback threads and the compute thread.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "runtime/auth/service_identity.h"
#include "runtime/mlp/dense_mlp.h"
#include "runtime/mlp/host_plane/shard_host_plane.h"
#include "runtime/mlp/mlp_shard_session.h"
#include "tandem/v1/mlp.grpc.pb.h"

namespace tandem::mlp {

struct MlpShardOptions {
  std::string model_fingerprint;
  int max_rows = 8192;         // per call
  int max_batch_rows = 16384;  // per layer batch (calls past it wait for the next batch)
  MlpSessionFactory attach;    // the GPU data plane; null: Attach is UNIMPLEMENTED
  // The host data plane; null: AttachHost is UNIMPLEMENTED. Stopped by Shutdown.
  std::shared_ptr<ShardHostPlane> host_plane;
  int max_sessions = 64;  // Attach and AttachHost sessions together
};

struct MlpShardStats {
  int64_t calls = 0;
  int64_t batches = 0;  // layer batches computed
  int64_t rows = 0;     // rows computed
  int64_t max_batch_rows = 0;
  int64_t rejected = 0;     // INVALID_ARGUMENT or UNAUTHENTICATED
  int64_t expired = 0;      // past their deadline or cancelled before computing
  int64_t failed = 0;       // answered INTERNAL after a compute error
  int64_t sessions = 0;     // Attach and AttachHost sessions started
  int64_t plane_calls = 0;  // calls whose rows came through the host data plane
  double compute_seconds = 0;
};

class MlpShardService final : public tandem::v1::MlpShard::CallbackService {
 public:
  // Computes on the host (CpuMlpBackend over `weights`).
  MlpShardService(std::shared_ptr<const DenseMlpWeights> weights,
                  std::shared_ptr<const auth::ServiceIdentity> identity,
                  const MlpShardOptions& options);
  // Computes on `compute` (called from the compute thread only), serving its shape.
  MlpShardService(std::unique_ptr<MlpBackend> compute,
                  std::shared_ptr<const auth::ServiceIdentity> identity,
                  const MlpShardOptions& options);
  ~MlpShardService() override;
  MlpShardService(const MlpShardService&) = delete;
  MlpShardService& operator=(const MlpShardService&) = delete;

  grpc::ServerUnaryReactor* Info(grpc::CallbackServerContext* context,
                                 const tandem::v1::MlpInfoRequest* request,
                                 tandem::v1::MlpInfo* response) override;
  grpc::ServerUnaryReactor* Compute(grpc::CallbackServerContext* context,
                                    const tandem::v1::MlpComputeRequest* request,
                                    tandem::v1::MlpComputeResponse* response) override;
  grpc::ServerWriteReactor<tandem::v1::MlpAttachResponse>* Attach(
      grpc::CallbackServerContext* context, const tandem::v1::MlpAttachRequest* request) override;
  grpc::ServerWriteReactor<tandem::v1::MlpHostAttachResponse>* AttachHost(
      grpc::CallbackServerContext* context,
      const tandem::v1::MlpHostAttachRequest* request) override;

  void Shutdown();
  MlpShardStats stats() const;

 private:
  struct Call {
    grpc::CallbackServerContext* context;
    const tandem::v1::MlpComputeRequest* request;
    tandem::v1::MlpComputeResponse* response;
    grpc::ServerUnaryReactor* reactor;
    std::shared_ptr<ShardHostSession> session;  // the host data plane's; null: rows in request
    uint32_t slot = 0;
  };
  void Loop();
  // Queues a checked call for the compute thread (answers UNAVAILABLE when stopping).
  void Enqueue(Call call);
  class SessionCall;
  template <typename Request, typename Response>
  class SessionReactor;

  const std::unique_ptr<MlpBackend> compute_;  // the compute thread's
  const MlpShape shape_;
  const std::shared_ptr<const auth::ServiceIdentity> identity_;
  const MlpShardOptions options_;

  mutable absl::Mutex mu_;
  std::deque<Call> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  MlpShardStats stats_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<SessionCall*> attached_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace tandem::mlp
