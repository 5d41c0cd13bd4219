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
  if (options.identity == nullptr) {
    return absl::InvalidArgumentError("decode worker: no service identity");
  }
  std::unique_ptr<DecodeWorker> worker(new DecodeWorker());
  worker->engine_ = engine;
  worker->host_ = options.host;
  // Transfers write the KV cache itself, or its pinned host mirror when the backend moves only
  // host memory and the cache is on a GPU (transfer_memory.h).
  ASSIGN_OR_RETURN(std::vector<server::TransferLaneSetup> setups,
                   server::StartTransferLanes(*engine, std::move(backends), options.setup_timeout));
  worker->metrics_ = std::make_unique<server::WorkerMetricsReporter>(
      engine, /*count_generation=*/true, options.model_name);
  std::vector<kvtransfer::ReceiverLane> lanes;
  for (server::TransferLaneSetup& setup : setups) {
    const bool host = setup.memory.kind == kvtransfer::MemoryKind::kHost;
    lanes.push_back(
        kvtransfer::ReceiverLane{.thread = std::move(setup.thread),
                                 .region_id = setup.region_id,
                                 .layout = server::ToTransferLayout(setup.memory.layout),
                                 .staged = setup.memory.staged,
                                 .host_memory = host ? setup.memory.layout.base : nullptr,
                                 .host_bytes = host ? setup.memory.layout.bytes : 0});
  }
  metrics::WorkerMetrics* metrics = &worker->metrics_->metrics();
  ASSIGN_OR_RETURN(
      worker->receiver_,
      kvtransfer::KvReceiver::Create(std::move(lanes), {.fence_lease = options.service.fence_lease,
                                                        .setup_timeout = options.setup_timeout,
                                                        .on_quarantine = [metrics](int n) {
                                                          metrics->kv_quarantined_blocks.Increment(
                                                              static_cast<double>(n));
                                                        }}));
  worker->decode_service_ =
      std::make_unique<DecodeService>(engine, &worker->metrics_->metrics(), worker->receiver_.get(),
                                      options.identity, options.service);
  worker->stats_service_ = std::make_unique<server::WorkerStatsService>(
      "decode", options.model_name, engine, options.identity);
  ASSIGN_OR_RETURN(
      worker->server_,
      server::StartGrpcServer(
          options.host, options.port, {worker->decode_service_.get(), worker->stats_service_.get()},
          {v1::Decode::service_full_name(), v1::Worker::service_full_name()}, options.identity));
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
  if (receiver_ != nullptr) receiver_->Stop();
}

}  // namespace tandem::decode
