#pragma once
// Decode.Generate and Decode.Cancel: the decode worker's request edge (DESIGN.md "A request, end
// to end", steps 3, 5-7).
//
// Generate validates the request, then either submits it to the engine for local prefill
// (prefill_worker empty) or, once the prefill worker admitted the prompt (Prefill.Admit:
// options.two_phase_admission), reserves KV blocks through Engine::SubmitRemotePrefill, asks the
// named prefill worker (Prefill.Prefill) to write the prompt's KV into them, and completes the
// remote prefill with the first token it returns. Before its first request to a prefill worker it
// pairs with it (Prefill.Connect: this worker's endpoints, one per backend in preference order,
// and its model's compatibility fields); later requests name the pair and their block ids only.
// The pair is cached per prefill worker address and dropped when the prefill worker no longer
// knows it (it restarted). A failed handshake makes the request prefill locally. If the prefill
// worker fails (down, transfer failure, deadline), the engine recomputes the prompt locally: the
// client sees the same tokens. Tokens stream back as the engine emits them; a client that goes away
// cancels the request and its blocks are freed.
// The blocks a prefill worker writes are the receiver's expectation (kv_receiver.h): it gives the
// call its transfer epoch, verifies a checksum where asked (options.verify_kv), and holds the
// quarantine. Fencing (DESIGN.md "Trust and failure model"): when the call does not succeed
// (error, deadline, cancel) the request's blocks are quarantined (the gauge
// tandem_kv_quarantined_blocks): nothing recomputes into them and nobody else gets them until
// Prefill.Fence confirms that no write of that epoch is in flight, or the lease passes. Only then
// does the engine recompute the prompt locally, or free the blocks.
//
// Authentication: every handler first checks the caller's service identity (UNAUTHENTICATED
// touches nothing). Cancel is honoured only with the request's cancel_token (chosen by the caller
// that sent Generate) and from the same peer (ServiceIdentity::Peer); anything else answers
// found=false, so request ids cannot be probed either.
// Prefill workers dialled: those of options.allowed_prefill_workers, else the address the
// authenticated caller (the router, which knows its prefill pool) names; at most
// kMaxPrefillChannels cached (the least recently added is dropped).
// Threading (STYLE.md 12): no thread per call and no polling. Each Generate is one state object
// (GenerateCall, a gRPC server write reactor) whose steps run one at a time on the service's
// CallExecutor (options.executor_threads threads, runtime/base/call_executor.h). Engine
// callbacks, gRPC reactions (writes done, client gone, Prefill/Fence/Connect answered), Cancel
// and timers (reservation, stall, cancel, fence lease deadlines) only post to the call's mailbox
// and poke its strand. The engine thread owns the batch. The pair handshake with a prefill
// worker is one shared Connect per address, whatever the number of calls waiting for it.
// Ownership: engine, receiver and metrics are not owned and must outlive the service.

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/kv_receiver.h"
#include "runtime/auth/service_identity.h"
#include "runtime/base/call_executor.h"
#include "runtime/engine/engine.h"
#include "runtime/metrics/metrics.h"
#include "tandem/v1/decode.grpc.pb.h"
#include "tandem/v1/kv.pb.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::decode {

struct DecodeServiceOptions {
  // Waiting for KV blocks for a prompt (remotely prefilled or not), capped by the call's deadline:
  // under overload requests queue in the engine, FCFS, instead of failing.
  absl::Duration reserve_timeout = absl::Seconds(600);
  // Deadline of one Prefill.Prefill call (capped by the client's own deadline).
  absl::Duration prefill_timeout = absl::Seconds(60);
  // A request that gets no output for this long is cancelled.
  absl::Duration stall_timeout = absl::Seconds(300);
  // After cancelling, how long to wait for the engine's final output.
  absl::Duration cancel_timeout = absl::Seconds(5);
  // Prefill.Connect (the pair handshake).
  absl::Duration connect_timeout = absl::Seconds(10);
  // After a Prefill call that failed or was given up: Prefill.Fence's deadline, and the lease
  // after which the quarantined blocks are reused without the prefill worker's confirmation (the
  // worker gives it to its KvReceiver).
  absl::Duration fence_timeout = absl::Seconds(5);
  absl::Duration fence_lease = absl::Seconds(10);
  // Verify each remotely prefilled prompt's KV where it landed in host memory (this worker's CPU
  // cache or host mirror): the prefill worker sends a checksum of what it wrote
  // (kvtransfer/kv_checksum.h) and a mismatch makes the prompt recompute locally, counted as
  // tandem_kv_transfer_failures_total{stage="checksum"}. Costs one pass over the KV on each side.
  bool verify_kv = false;
  // The prefill workers (host:port) this worker may dial; a Generate naming another is refused
  // with PERMISSION_DENIED. Empty: any (the request's address is trusted: set it in production).
  absl::flat_hash_set<std::string> allowed_prefill_workers;
  // Two-phase reservation: ask the prefill worker to admit a prompt (Prefill.Admit) before
  // reserving its blocks, so blocks are not held by prompts queued at the prefill worker. Off:
  // reserve at once (the prefill worker's queue then holds reserved blocks). A prefill worker that
  // does not implement Admit is treated as off; one that refuses or fails it makes the prompt
  // prefill here.
  bool two_phase_admission = true;
  // Threads that run the calls' steps (each step is short and never blocks on the network).
  int executor_threads = 2;
};

class DecodeService final : public v1::Decode::CallbackService {
 public:
  // `receiver`: this worker's lanes (kvtransfer/handoff/kv_receiver.h): the endpoints it offers
  // in the pair handshake, in preference order, and the owner of every expected transfer's blocks.
  // `identity`: checked on every call, and presented when dialling prefill workers.
  DecodeService(Engine* engine, metrics::WorkerMetrics* metrics, kvtransfer::KvReceiver* receiver,
                std::shared_ptr<const auth::ServiceIdentity> identity,
                DecodeServiceOptions options);
  // After the server has shut down (every call done): stops the executor.
  ~DecodeService() override;

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* context,
                                   const v1::CancelRequest* request,
                                   v1::CancelResponse* response) override;

  // Shutdown began: in-flight Prefill calls are cancelled at once instead of awaited.
  void BeginShutdown();

 private:
  class GenerateCall;
  struct PairingAttempt;
  struct Pairing {
    std::string pair_id;
    std::string backend;    // the chosen endpoint's (metrics label)
    bool staged = false;    // the chosen endpoint's KV lands in the host mirror
    size_t endpoint = 0;    // index in endpoints_
    std::string grant_key;  // sent at Connect; signs each request's block ids (kv_grant.h)
  };
  static constexpr size_t kMaxPrefillChannels = 256;
  // Shared: a call in flight keeps its stub (and channel) even if the cache drops it.
  std::shared_ptr<v1::Prefill::Stub> PrefillStub(const std::string& address);
  bool shutting_down();
  // The cached pair with the prefill worker at `address`, or the handshake that will make it
  // (started now unless one is in flight); `call` is poked when it ends.
  std::variant<Pairing, std::shared_ptr<PairingAttempt>> PairWith(
      const std::string& address, const std::shared_ptr<GenerateCall>& call);
  // On the executor, when an attempt's Connect answered.
  void FinishPairing(const std::shared_ptr<PairingAttempt>& attempt, const grpc::Status& status);
  void ForgetPair(const std::string& address, const std::string& pair_id);

  Engine* const engine_;
  metrics::WorkerMetrics* const metrics_;
  kvtransfer::KvReceiver* const receiver_;
  const std::shared_ptr<const auth::ServiceIdentity> identity_;
  const DecodeServiceOptions options_;
  std::vector<v1::KvEndpoint> endpoints_;  // the receiver's, as offered in the handshake

  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<v1::Prefill::Stub>> stubs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> stub_order_ ABSL_GUARDED_BY(mu_);               // oldest first
  absl::flat_hash_map<std::string, Pairing> pairs_ ABSL_GUARDED_BY(mu_);  // by prefill address
  absl::flat_hash_map<std::string, std::shared_ptr<PairingAttempt>> pairing_ ABSL_GUARDED_BY(mu_);
  // Live Generate calls by request id (Decode.Cancel reaches them through their mailbox).
  absl::flat_hash_map<std::string, std::shared_ptr<GenerateCall>> live_ ABSL_GUARDED_BY(mu_);
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  std::shared_ptr<CallExecutor> executor_;  // shared with the calls' strands
};

}  // namespace tandem::decode
