#pragma once
// Prefill.Connect and Prefill.Prefill: computes a prompt's KV, writes it into the caller's (a
// decode worker's) blocks through kvtransfer, and answers with the first token once every write
// is acknowledged (DESIGN.md "A request, end to end", step 4).
//
// Pairs: a decode worker first calls Connect with its endpoints (one per backend it runs, in its
// preference order) and its model's compatibility fields. The service refuses a model or layout
// mismatch (FAILED_PRECONDITION, before any byte moves), takes the first endpoint whose backend
// it runs too and can connect to (each skipped one is a fallback: logged once per decode worker
// and backend, counted, and returned), and answers with an unguessable pair id. Prefill requests
// that name the pair carry only block ids; the region, layout and agent come from the handshake.
// Requests without a pair id carry the whole target (the older protocol).
//
// Flow: the handler validates the request (target layout incompatible with ours or another
// backend: FAILED_PRECONDITION) and submits it to the engine with hold_kv_after_prefill. On the
// engine thread, on_prefilled hands the held blocks to the transfer thread, which connects to the
// target agent (connections cached), plans block copies (skipping blocks the target already
// caches), posts the writes and polls them to completion, then releases the transfer and the held
// blocks. The handler waits for that with a deadline.
// Layer-wise streaming (options.kv_streaming, a device lane, an engine that reports chunks):
// before each step of the prompt the engine reports the chunk (on_kv_chunk); the lane's transfer
// thread plans its writes per layer and posts each once the runner's layer progress passes it,
// under the remaining layers; on_prefilled then posts whatever is left and the job finishes when
// every write has landed. Every posted write is released (Release waits for a running copy)
// before the job answers, also when it fails.
// Layout conversion: a pair whose layouts differ in block size, dtype or head range (kv_convert.h)
// is admitted when the lane reads host memory; each prompt's KV is then converted on the transfer
// thread into a buffer of the destination's format, written in one transfer, and freed after.
// Fencing: a request naming a pair carries a transfer epoch. Prefill.Fence(pair, epoch) marks the
// job abandoned ON its lane's transfer thread (every post happens there, after an abandoned check,
// so no write is posted afterwards), then waits until every posted write has been released, and
// answers quiescent. The decode worker reuses the blocks of a failed transfer only after that.
// Failures: any transfer failure answers with an error status (the decode worker then prefills
// locally). If the handler's deadline passes or its client goes away, everything is released
// (transfer handle, held blocks; the engine's held-KV lease is the last resort). P holds nothing
// after it replies.
//
// Threading (STYLE.md 12): the engine thread owns the batch, each lane's transfer thread owns its
// backend; gRPC handler threads only validate, enqueue and wait.
// Ownership: engine, transfer threads and metrics are not owned and must outlive the service.

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/kv_layout.h"
#include "runtime/engine/engine.h"
#include "runtime/metrics/metrics.h"
#include "runtime/server/transfer_thread.h"
#include "tandem/v1/prefill.grpc.pb.h"

namespace tandem::prefill {

struct PrefillServiceOptions {
  // Whole call (queue + compute + transfer), capped by the client's deadline.
  absl::Duration prefill_timeout = absl::Seconds(60);
  // From the KV being ready to the last write acknowledged; keep below the engine's held-KV lease.
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
};

// One transfer backend of the worker: its thread, the region its transfer memory is registered
// as, and whether that memory is the engine's host mirror (the engine stages through it).
struct TransferLane {
  server::TransferThread* transfer = nullptr;  // not owned
  uint64_t local_region = 0;
  bool staged = false;
  // The registered memory when it is host memory (the KV cache of a CPU engine, or the host
  // mirror): KV of another block format is converted from it. Null for device memory.
  const void* host_memory = nullptr;
  size_t host_bytes = 0;
};

class PrefillService final : public v1::Prefill::Service {
 public:
  // `lanes`: the worker's backends (distinct names), each with its registered transfer memory
  // (the engine's kv_layout() offsets).
  PrefillService(Engine* engine, std::vector<TransferLane> lanes, metrics::WorkerMetrics* metrics,
                 PrefillServiceOptions options);

  grpc::Status Connect(grpc::ServerContext* context, const v1::ConnectRequest* request,
                       v1::ConnectResponse* response) override;
  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override;
  grpc::Status Fence(grpc::ServerContext* context, const v1::FenceRequest* request,
                     v1::FenceResponse* response) override;

  // Before the transfer thread stops: KV that becomes ready afterwards is released at once (the
  // engine may still call back after the service is gone, so callbacks hold only `dispatch_`).
  void Detach();

 private:
  struct Job;
  struct Stream;
  struct Staging;
  struct Dispatch {
    absl::Mutex mu;
    PrefillService* service ABSL_GUARDED_BY(mu);
  };
  // What a handshake fixed for a pair.
  struct Pair {
    size_t lane = 0;
    v1::KvEndpoint endpoint;
    kvtransfer::KvLayout layout;
  };
  // The lane running `backend`, or lanes_.size().
  size_t FindLane(const std::string& backend) const;
  // OK when this worker can write its KV into `target` over `lane`: byte copies of the same block
  // format, or a conversion (kv_convert.h) from the lane's host memory.
  absl::Status CheckLayouts(const TransferLane& lane, const kvtransfer::KvLayout& target) const;
  // Transfer thread: converts the KV into a staging buffer registered with `backend`.
  absl::StatusOr<std::shared_ptr<Staging>> Convert(kvtransfer::TransferBackend& backend,
                                                   const TransferLane& lane,
                                                   const kvtransfer::KvLayout& target,
                                                   std::span<const int32_t> src_blocks,
                                                   std::span<const int32_t> dst_blocks,
                                                   int num_tokens, int skip_tokens);
  // Transfer thread of the job's lane only.
  void StartTransfer(kvtransfer::TransferBackend& backend, const std::shared_ptr<Job>& job);
  // Connects to the job's agent unless connected with its address (transfer thread).
  absl::Status EnsurePeer(kvtransfer::TransferBackend& backend, const Job& job);
  // Layer-wise streaming (transfer thread): queues a chunk's per-layer writes, and the poller
  // that posts each once its layer is computed and finishes the job after on_prefilled.
  void OnKvChunk(kvtransfer::TransferBackend& backend, const std::shared_ptr<Job>& job,
                 const KvChunk& chunk);
  bool PollStream(kvtransfer::TransferBackend& backend, const std::shared_ptr<Job>& job,
                  bool stopping);

  Engine* const engine_;
  const std::vector<TransferLane> lanes_;
  metrics::WorkerMetrics* const metrics_;
  const PrefillServiceOptions options_;
  const kvtransfer::KvLayout layout_;

  const std::shared_ptr<Dispatch> dispatch_;

  absl::Mutex pairs_mu_;
  absl::flat_hash_map<std::string, Pair> pairs_ ABSL_GUARDED_BY(pairs_mu_);
  std::deque<std::string> pair_order_ ABSL_GUARDED_BY(pairs_mu_);  // oldest first (bounded)
  // (decode worker, backend) fallbacks already logged.
  absl::flat_hash_set<std::string> logged_fallbacks_ ABSL_GUARDED_BY(pairs_mu_);

  // Fenceable jobs by "pair_id/epoch" (weak: a job nobody holds can post nothing).
  absl::Mutex jobs_mu_;
  absl::flat_hash_map<std::string, std::weak_ptr<Job>> jobs_ ABSL_GUARDED_BY(jobs_mu_);

  // Per lane, its transfer thread only: connected peers, agent name -> address.
  std::vector<absl::flat_hash_map<std::string, std::string>> peers_;
};

}  // namespace tandem::prefill
