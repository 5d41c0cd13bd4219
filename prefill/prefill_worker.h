#pragma once
// The prefill worker, assembled: an Engine (not owned) serving Prefill and Worker over gRPC, with
// one or more transfer backends (in preference order: `--kv-transfer auto` on a GPU is cuda_ipc,
// then ucx). Each registers its transfer memory once (runtime/server/transfer_memory.h: the GPU
// KV cache itself for cuda_ipc, the engine's pinned host mirror for a host backend on a GPU, the
// KV cache on the CPU) so it can write prompts' KV into decode workers' blocks (`tandem prefill`
// runs one; integration tests run several in one process on port 0).
//
// Threads: the engine's loop thread owns the batch; gRPC threads run the handlers
// (prefill_service.h); one KvSender per backend owns it on its transfer thread (connect, post,
// poll, release; kvtransfer/handoff/kv_sender.h).
// Lifetime: Create starts serving (health SERVING); Shutdown (also the destructor) stops
// accepting, gives in-flight calls `drain`, cancels the rest, releases every transfer and held
// block, and stops the transfer thread. The engine must outlive the worker; shut the engine down
// after the worker.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/kv_sender.h"
#include "kvtransfer/transfer_backend.h"
#include "prefill/prefill_service.h"
#include "runtime/auth/service_identity.h"
#include "runtime/engine/engine.h"
#include "runtime/server/grpc_server.h"
#include "runtime/server/worker_metrics.h"
#include "runtime/server/worker_stats_service.h"

namespace tandem::prefill {

struct PrefillWorkerOptions {
  std::string host = "127.0.0.1";  // gRPC bind address
  int port = 0;                    // 0: any free port (see port())
  std::string model_name;          // reported in Worker.StreamStats
  // Required: who may call this worker (router, decode workers) and what it presents when it
  // dials (runtime/auth/service_identity.h).
  std::shared_ptr<const auth::ServiceIdentity> identity = nullptr;
  PrefillServiceOptions service;
  // Registering the KV cache with the backend at start-up.
  absl::Duration setup_timeout = absl::Seconds(30);
};

class PrefillWorker {
 public:
  // Registers the engine's transfer memory with each backend (on its transfer thread) and starts
  // serving. Errors: no identity, no backend or two of one name (InvalidArgument), the engine's
  // transfer_layout() (mirror allocation), a backend's registration error, or Unavailable when
  // the port can't be bound; nothing is left running then.
  static absl::StatusOr<std::unique_ptr<PrefillWorker>> Create(
      Engine* engine, std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends,
      const PrefillWorkerOptions& options);
  // One backend.
  static absl::StatusOr<std::unique_ptr<PrefillWorker>> Create(
      Engine* engine, std::unique_ptr<kvtransfer::TransferBackend> backend,
      const PrefillWorkerOptions& options);
  ~PrefillWorker();
  PrefillWorker(const PrefillWorker&) = delete;
  PrefillWorker& operator=(const PrefillWorker&) = delete;

  int port() const { return port_; }
  std::string address() const;  // host:port
  server::WorkerMetricsReporter& metrics() { return *metrics_; }
  AdmissionStats admission_stats() const { return prefill_service_->admission_stats(); }

  void Shutdown(absl::Duration drain);

 private:
  PrefillWorker() = default;

  std::string host_;
  int port_ = 0;
  std::vector<std::unique_ptr<kvtransfer::KvSender>> senders_;
  std::unique_ptr<server::WorkerMetricsReporter> metrics_;
  std::unique_ptr<PrefillService> prefill_service_;
  std::unique_ptr<server::WorkerStatsService> stats_service_;
  server::GrpcServer server_;
  absl::Mutex shutdown_mu_;
};

}  // namespace tandem::prefill
