#pragma once
// The decode worker, assembled: an Engine (not owned) serving Decode and Worker over gRPC, with
// one or more transfer backends (preference order; `--kv-transfer auto` on a GPU is cuda_ipc,
// then ucx). Each registers and exports its transfer memory once (runtime/server/
// transfer_memory.h: the GPU KV cache itself for cuda_ipc, the pinned host mirror the engine
// stages received blocks from for a host backend on a GPU, the KV cache on the CPU); they are the
// endpoints this worker offers prefill workers in the pair handshake (`tandem decode` runs one;
// integration tests run several in one process on port 0).
//
// Threads: the engine's loop thread owns the batch; gRPC threads run the handlers
// (decode_service.h); the KvReceiver (kvtransfer/handoff/kv_receiver.h) owns the lanes: one
// transfer thread per backend owns it and keeps it progressing (UCX's tcp / shared-memory
// transports need target-side progress for writes to land).
// Lifetime: Create starts serving (health SERVING); Shutdown (also the destructor) stops
// accepting, gives in-flight calls `drain` to finish, cancels the rest and stops the transfer
// thread. The engine must outlive the worker; shut the engine down after the worker.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "decode/decode_service.h"
#include "kvtransfer/handoff/kv_receiver.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/auth/service_identity.h"
#include "runtime/engine/engine.h"
#include "runtime/server/grpc_server.h"
#include "runtime/server/worker_metrics.h"
#include "runtime/server/worker_stats_service.h"

namespace tandem::decode {

struct DecodeWorkerOptions {
  std::string host = "127.0.0.1";  // gRPC bind address
  int port = 0;                    // 0: any free port (see port())
  std::string model_name;          // reported in Worker.StreamStats
  // Required: who may call this worker (the router) and what it presents to prefill workers
  // (runtime/auth/service_identity.h).
  std::shared_ptr<const auth::ServiceIdentity> identity = nullptr;
  DecodeServiceOptions service;
  // Registering and exporting the KV cache with the backend at start-up.
  absl::Duration setup_timeout = absl::Seconds(30);
};

class DecodeWorker {
 public:
  // Registers the engine's transfer memory with each backend (on its transfer thread) and starts
  // serving. Errors: no identity, no backend or two of one name (InvalidArgument), the engine's
  // transfer_layout() (mirror allocation), a backend's (register, export, address) or Unavailable
  // when the port can't be bound; nothing is left running then.
  static absl::StatusOr<std::unique_ptr<DecodeWorker>> Create(
      Engine* engine, std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends,
      const DecodeWorkerOptions& options);
  // One backend.
  static absl::StatusOr<std::unique_ptr<DecodeWorker>> Create(
      Engine* engine, std::unique_ptr<kvtransfer::TransferBackend> backend,
      const DecodeWorkerOptions& options);
  ~DecodeWorker();
  DecodeWorker(const DecodeWorker&) = delete;
  DecodeWorker& operator=(const DecodeWorker&) = delete;

  int port() const { return port_; }
  std::string address() const;  // host:port
  server::WorkerMetricsReporter& metrics() { return *metrics_; }

  void Shutdown(absl::Duration drain);

 private:
  DecodeWorker() = default;

  Engine* engine_ = nullptr;
  std::string host_;
  int port_ = 0;
  std::unique_ptr<server::WorkerMetricsReporter> metrics_;  // outlives the receiver's callback
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  std::unique_ptr<DecodeService> decode_service_;
  std::unique_ptr<server::WorkerStatsService> stats_service_;
  server::GrpcServer server_;
  absl::Mutex shutdown_mu_;
};

}  // namespace tandem::decode
