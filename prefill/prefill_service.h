#pragma once
// Prefill.Prefill: computes a prompt's KV, writes it into the caller's (a decode worker's) blocks
// through kvtransfer, and answers with the first token once every write is acknowledged
// (DESIGN.md "A request, end to end", step 4; whole-prompt transfer).
//
// Flow: the handler validates the request (target layout incompatible with ours or another
// backend: FAILED_PRECONDITION) and submits it to the engine with hold_kv_after_prefill. On the
// engine thread, on_prefilled hands the held blocks to the transfer thread, which connects to the
// target agent (connections cached), plans block copies (skipping blocks the target already
// caches), posts the writes and polls them to completion, then releases the transfer and the held
// blocks. The handler waits for that with a deadline.
// Failures: any transfer failure answers with an error status (the decode worker then prefills
// locally). If the handler's deadline passes or its client goes away, everything is released
// (transfer handle, held blocks; the engine's held-KV lease is the last resort). P holds nothing
// after it replies.
//
// Threading (STYLE.md 12): the engine thread owns the batch, the transfer thread owns the
// backend; gRPC handler threads only validate, enqueue and wait.
// Ownership: engine, transfer thread and metrics are not owned and must outlive the service.

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
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
};

class PrefillService final : public v1::Prefill::Service {
 public:
  // `local_region`: the id under which the engine's whole transfer memory (transfer_layout()) is
  // registered with the transfer thread's backend.
  PrefillService(Engine* engine, server::TransferThread* transfer, uint64_t local_region,
                 metrics::WorkerMetrics* metrics, PrefillServiceOptions options);

  grpc::Status Prefill(grpc::ServerContext* context, const v1::PrefillRequest* request,
                       v1::PrefillResponse* response) override;

  // Before the transfer thread stops: KV that becomes ready afterwards is released at once (the
  // engine may still call back after the service is gone, so callbacks hold only `dispatch_`).
  void Detach();

 private:
  struct Job;
  struct Dispatch {
    absl::Mutex mu;
    PrefillService* service ABSL_GUARDED_BY(mu);
  };
  // Transfer thread only.
  void StartTransfer(kvtransfer::TransferBackend& backend, const std::shared_ptr<Job>& job);

  Engine* const engine_;
  server::TransferThread* const transfer_;
  const uint64_t local_region_;
  metrics::WorkerMetrics* const metrics_;
  const PrefillServiceOptions options_;
  const kvtransfer::KvLayout layout_;

  const std::shared_ptr<Dispatch> dispatch_;

  // Transfer thread only: connected peers, agent name -> address.
  absl::flat_hash_map<std::string, std::string> peers_;
};

}  // namespace tandem::prefill
