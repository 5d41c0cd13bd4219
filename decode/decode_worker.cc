#include "decode/decode_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/transfer_memory.h"

namespace tandem::decode {

absl::StatusOr<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(
    Engine* engine, std::unique_ptr<kvtransfer::TransferBackend> backend,
    const DecodeWorkerOptions& options) {
  std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends;
  backends.push_back(std::move(backend));
  return Create(engine, std::move(backends), options);
}

absl::StatusOr<std::unique_ptr<DecodeWorker>> DecodeWorker::Create(
    Engine* engine, std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends,
    const DecodeWorkerOptions& options) {
  std::unique_ptr<DecodeWorker> worker(new DecodeWorker());
  worker->engine_ = engine;
  worker->host_ = options.host;
  // Transfers write the KV cache itself, or its pinned host mirror when the backend moves only
  // host memory and the cache is on a GPU (transfer_memory.h).
  ASSIGN_OR_RETURN(std::vector<server::TransferLaneSetup> setups,
                   server::StartTransferLanes(*engine, std::move(backends), options.setup_timeout));
  std::vector<DecodeEndpoint> endpoints;
  for (server::TransferLaneSetup& setup : setups) {
    // This worker's identity on the backend, read on its transfer thread.
    DecodeEndpoint endpoint;
    endpoint.staged = setup.memory.staged;
    endpoint.transfer = setup.thread.get();
    if (setup.memory.kind == kvtransfer::MemoryKind::kHost) {
      endpoint.host_memory = setup.memory.layout.base;
      endpoint.host_bytes = setup.memory.layout.bytes;
    }
    v1::KvEndpoint& e = endpoint.endpoint;
    e.set_backend(setup.thread->backend_name());
    const uint64_t region_id = setup.region_id;
    RETURN_IF_ERROR(setup.thread->Run(
        [&e, region_id](kvtransfer::TransferBackend& b) -> absl::Status {
          ASSIGN_OR_RETURN(std::string blob, b.ExportRegion(region_id));
          ASSIGN_OR_RETURN(std::string address, b.LocalAddress());
          e.set_agent_name(b.agent_name());
          e.set_agent_address(std::move(address));
          e.set_region(std::move(blob));
          return absl::OkStatus();
        },
        options.setup_timeout));
    server::KvLayoutToProto(server::ToTransferLayout(setup.memory.layout), e.mutable_layout());
    endpoints.push_back(std::move(endpoint));
    worker->transfers_.push_back(std::move(setup.thread));
  }

  worker->metrics_ = std::make_unique<server::WorkerMetricsReporter>(engine);
  worker->decode_service_ = std::make_unique<DecodeService>(engine, &worker->metrics_->metrics(),
                                                            std::move(endpoints), options.service);
  worker->stats_service_ =
      std::make_unique<server::WorkerStatsService>("decode", options.model_name, engine);
  ASSIGN_OR_RETURN(
      worker->server_,
      server::StartGrpcServer(options.host, options.port,
                              {worker->decode_service_.get(), worker->stats_service_.get()},
                              {v1::Decode::service_full_name(), v1::Worker::service_full_name()}));
  worker->port_ = worker->server_.port;
  return worker;
}

DecodeWorker::~DecodeWorker() { Shutdown(absl::ZeroDuration()); }

std::string DecodeWorker::address() const { return absl::StrCat(host_, ":", port_); }

void DecodeWorker::Shutdown(absl::Duration drain) {
  absl::MutexLock lock(&shutdown_mu_);
  if (stats_service_ != nullptr) stats_service_->Stop();
  // In-flight calls get `drain`; those cancelled after it stop waiting for their prefill worker.
  if (decode_service_ != nullptr) decode_service_->BeginShutdown();
  server_.Shutdown(drain);
  for (auto& transfer : transfers_) transfer->Stop();
}

}  // namespace tandem::decode
