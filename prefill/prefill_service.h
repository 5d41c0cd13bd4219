#pragma once
// Prefill.Connect and Prefill.Prefill: computes a prompt's KV, writes it into the caller's (a
// decode worker's) blocks through kvtransfer, and answers with the first token once every write
// is acknowledged (DESIGN.md "A request, end to end", step 4).
//
// Authentication: every handler first checks the caller's service identity (UNAUTHENTICATED
// touches nothing; runtime/auth/service_identity.h).
// Pairs: a decode worker first calls Connect with its endpoints (one per backend it runs, in its
// preference order) and its model's compatibility fields. The service refuses a model or layout
// mismatch (FAILED_PRECONDITION, before any byte moves), takes the first endpoint whose backend
// it runs too and can connect to (each skipped one is a fallback: logged once per decode worker
// and backend, counted, and returned), and answers with an unguessable pair id. Prefill requests
// that name the pair carry only block ids; the region, layout and agent come from the handshake.
// A request must name a pair (a whole target in a request is refused), carry the decode worker's
// grant for exactly its block ids (runtime/auth/kv_grant.h: an HMAC under the key the decode
// worker sent at Connect; PERMISSION_DENIED otherwise, checked before anything else of the pair
// changes), and a transfer epoch the pair has not used, within a window below its highest (a
// captured request cannot be replayed).
//
// Flow: the handler validates the request (target layout incompatible with ours, or blocks that
// do not cover the prompt: FAILED_PRECONDITION), begins a send on the pair's lane
// (kvtransfer/handoff/kv_sender.h, which owns the handoff from there) and submits the prompt to
// the engine with hold_kv_after_prefill. The engine's callbacks only forward to the send: each
// chunk before its step (layer-wise streaming: options.kv_streaming, a device lane, an engine that
// reports chunks, same block format), the held KV when the prompt is done (the send gives the
// blocks back to the engine, once), or the prefill's failure. The handler waits for the send's
// report with a deadline and answers with the first token once every write has landed.
// Admission (two-phase reservation, admission_queue.h): a decode worker first calls
// Prefill.Admit(pair, request id, prompt length, priority), answered once the prompt fits this
// worker's admission window (options.admission), and only then reserves its KV blocks and calls
// Prefill with the ticket. The window bounds the prompt tokens admitted and not yet done (tickets
// and Prefill calls in progress, with or without a ticket), so decode blocks are reserved for
// prompts that are about to be prefilled, not for prompts queued here. Requests waiting to be
// admitted count as waiting in the engine's stats (Engine::SetQueuedOutside): the router and the
// metrics see the whole queue. An unknown pair is NOT_FOUND; a prompt length outside
// [1, max_model_len] INVALID_ARGUMENT; the deadline (options.admit_timeout, capped by the
// client's) DEADLINE_EXCEEDED; StopAdmitting answers everyone UNAVAILABLE.
// Layout conversion: a pair whose layouts differ in block size, dtype or head range (kv_convert.h)
// is admitted when the lane reads host memory; the sender converts each prompt into a buffer of
// the destination's format and writes that (not streamed).
// Fencing: a request naming a pair carries a transfer epoch. Prefill.Fence(pair, epoch) fences
// that send (no write is posted after it; it waits until the posted ones are released) and
// answers quiescent. The decode worker reuses the blocks of a failed transfer only after that.
// Failures: any transfer failure answers with an error status (the decode worker then prefills
// locally). If the handler's deadline passes or its client goes away, the send is abandoned and
// releases everything (the engine's held-KV lease is the last resort). P holds nothing after it
// replies.
// Metrics: every send's report is counted with its backend as a label (worker_metrics: bytes,
// transfers, ops, latency, exposed time, bandwidth, hidden fraction, failures by stage).
// Threading (STYLE.md 12): the engine thread owns the batch, each lane's transfer thread owns its
// backend (inside its KvSender); a Prefill call's reactor is completed from whichever of them
// reports first (or the client going away, or its deadline on a timer thread); Connect and Fence
// run on gRPC's sync threads.
// Ownership: engine, senders and metrics are not owned; the engine and metrics must outlive the
// service, the senders its Detach.

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/kv_sender.h"
#include "kvtransfer/kv_layout.h"
#include "prefill/admission_queue.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/call_executor.h"
#include "runtime/engine/engine.h"
#include "runtime/metrics/metrics.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::prefill {

struct PrefillServiceOptions {
  // Whole call (queue + compute + transfer), capped by the client's deadline.
  absl::Duration prefill_timeout = absl::Seconds(60);
  // From the KV being ready to the last write acknowledged (each lane's KvSenderOptions, set by
  // the worker); keep below the engine's held-KV lease.
  absl::Duration transfer_timeout = absl::Seconds(20);
  // Connect: the backend connection to a decode worker's agent, per endpoint tried.
  absl::Duration connect_timeout = absl::Seconds(10);
  // Pairs kept (the oldest is forgotten beyond this: its decode worker then connects again).
  size_t max_pairs = 4096;
  // Layer-wise streaming over device backends (cuda_ipc) when the engine reports chunks
  // (EngineOptions::kv_layer_progress): each layer's writes are posted as soon as its KV is
  // computed, under the remaining layers. Off: one transfer after the whole prompt.
  bool kv_streaming = true;
  // Prefill.Fence: how long it waits for an abandoned transfer's writes to be released.
  absl::Duration fence_timeout = absl::Seconds(5);
  // Prefill.Admit (two-phase reservation): the window, the tickets' lease, and the longest a
  // request waits to be admitted (capped by the client's deadline).
  AdmissionOptions admission;
  absl::Duration admit_timeout = absl::Seconds(600);
};

// One transfer backend of the worker: its sender, and whether the engine stages KV through the
// host mirror for it.
struct TransferLane {
  kvtransfer::KvSender* sender = nullptr;  // not owned
  bool staged = false;
};

// Prefill.Prefill and Prefill.Admit are callback methods (a reactor per call, completed by the
// send's report, the admission window, the client going away or the deadline: no thread waits);
// Connect and Fence, rare and bounded by their timeouts, stay synchronous.
class PrefillService final : public v1::Prefill::WithCallbackMethod_Admit<
                                 v1::Prefill::WithCallbackMethod_Prefill<v1::Prefill::Service>> {
 public:
  // `lanes`: the worker's backends (distinct names), each a sender of the engine's KV (its
  // transfer memory registered with the lane's backend).
  PrefillService(Engine* engine, std::vector<TransferLane> lanes, metrics::WorkerMetrics* metrics,
                 std::shared_ptr<const auth::ServiceIdentity> identity,
                 PrefillServiceOptions options);

  grpc::Status Connect(grpc::ServerContext* context, const v1::ConnectRequest* request,
                       v1::ConnectResponse* response) override;
  ~PrefillService() override;
  grpc::ServerUnaryReactor* Prefill(grpc::CallbackServerContext* context,
                                    const v1::PrefillRequest* request,
                                    v1::PrefillResponse* response) override;
  grpc::Status Fence(grpc::ServerContext* context, const v1::FenceRequest* request,
                     v1::FenceResponse* response) override;
  grpc::ServerUnaryReactor* Admit(grpc::CallbackServerContext* context,
                                  const v1::AdmitRequest* request,
                                  v1::AdmitResponse* response) override;

  // Shutting down: every request waiting for admission (and every later one) is answered
  // UNAVAILABLE, so its decode worker prefills it itself.
  void StopAdmitting();
  AdmissionStats admission_stats() const { return admission_->stats(); }

  // Before the senders stop: sends that end from now on are not counted (the engine may still
  // call back after the service is gone, so callbacks hold only `dispatch_`).
  void Detach();

 private:
  struct Job;
  class PrefillCall;
  class AdmitCall;
  // Runs the admission queue's timers (deadlines, leases) at `when`.
  void ExpireAdmissionAt(absl::Time when);
  // Gives up on a call (client gone, deadline): releases its send, aborts a prompt still
  // computing, and finishes the call with `status`. No-op once the call is done.
  void GiveUp(const std::shared_ptr<Job>& job, absl::Status status);
  // Validates and starts a Prefill call: a refusal (nothing started), or OK once `call` is wired
  // to its job (which then finishes it).
  grpc::Status StartPrefill(grpc::CallbackServerContext* context, const v1::PrefillRequest* request,
                            PrefillCall* call);
  struct Dispatch {
    absl::Mutex mu;
    PrefillService* service ABSL_GUARDED_BY(mu);
  };
  // What a handshake fixed for a pair.
  struct Pair {
    size_t lane = 0;
    v1::KvEndpoint endpoint;
    kvtransfer::KvLayout layout;
    std::string grant_key;  // the decode worker's (runtime/auth/kv_grant.h)
    // Anti-replay: the highest transfer epoch accepted and those accepted within the window.
    uint64_t max_epoch = 0;
    absl::flat_hash_set<uint64_t> seen_epochs;
  };
  // The lane running `backend`, or lanes_.size().
  size_t FindLane(const std::string& backend) const;
  // Counts a send's report on the metrics of its lane's backend.
  void Record(const std::string& backend, const kvtransfer::KvSendReport& report);

  Engine* const engine_;
  const std::vector<TransferLane> lanes_;
  metrics::WorkerMetrics* const metrics_;
  const std::shared_ptr<const auth::ServiceIdentity> identity_;
  const PrefillServiceOptions options_;
  const kvtransfer::KvLayout layout_;

  const std::shared_ptr<Dispatch> dispatch_;
  // Runs the calls' deadline timers (one thread).
  std::shared_ptr<CallExecutor> timers_;
  const std::shared_ptr<AdmissionQueue> admission_;

  absl::Mutex pairs_mu_;
  absl::flat_hash_map<std::string, Pair> pairs_ ABSL_GUARDED_BY(pairs_mu_);
  std::deque<std::string> pair_order_ ABSL_GUARDED_BY(pairs_mu_);  // oldest first (bounded)
  // (decode worker, backend) fallbacks already logged.
  absl::flat_hash_set<std::string> logged_fallbacks_ ABSL_GUARDED_BY(pairs_mu_);

  // Fenceable calls by "pair_id/epoch". Weak: a send nobody holds (its thread ticks it while
  // anything of it is in flight) can post nothing; the job tells whether it still computes.
  struct Fenceable {
    std::weak_ptr<Job> job;
    std::weak_ptr<kvtransfer::KvSend> send;
  };
  absl::Mutex jobs_mu_;
  absl::flat_hash_map<std::string, Fenceable> jobs_ ABSL_GUARDED_BY(jobs_mu_);
};

}  // namespace tandem::prefill
