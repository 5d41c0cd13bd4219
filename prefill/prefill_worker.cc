#include "prefill/prefill_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/server/kv_layout_convert.h"
#include "runtime/server/transfer_memory.h"

namespace tandem::prefill {

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    Engine* engine, std::unique_ptr<kvtransfer::TransferBackend> backend,
    const PrefillWorkerOptions& options) {
  std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends;
  backends.push_back(std::move(backend));
  return Create(engine, std::move(backends), options);
}

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    Engine* engine, std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends,
    const PrefillWorkerOptions& options) {
  if (options.identity == nullptr) {
    return absl::InvalidArgumentError("prefill worker: no service identity");
  }
  std::unique_ptr<PrefillWorker> worker(new PrefillWorker());
  worker->host_ = options.host;
  // Transfers read the KV cache itself, or its pinned host mirror when the backend moves only
  // host memory and the cache is on a GPU (transfer_memory.h).
  ASSIGN_OR_RETURN(std::vector<server::TransferLaneSetup> setups,
                   server::StartTransferLanes(*engine, std::move(backends), options.setup_timeout));
  std::vector<TransferLane> lanes;
  const kvtransfer::KvLayout layout = server::ToTransferLayout(engine->kv_layout());
  for (server::TransferLaneSetup& setup : setups) {
    const kvtransfer::MemoryKind kind = setup.memory.kind;
    // KV another pool needs in another block format is converted where the lane reads it: on the
    // host, or on the GPU of a device lane.
    std::unique_ptr<kvtransfer::KvStaging> staging;
    if (kind == kvtransfer::MemoryKind::kHost) {
      staging = kvtransfer::CreateHostStaging();
    } else if (auto device = kvtransfer::CreateDeviceStaging(setup.memory.layout.device_ordinal);
               device.ok()) {
      staging = *std::move(device);
    } else {
      LOG(WARNING) << "prefill: the " << setup.thread->backend_name()
                   << " lane cannot convert KV for other pools: " << device.status();
    }
    auto sender = std::make_unique<kvtransfer::KvSender>(
        std::move(setup.thread),
        kvtransfer::KvSource{.layout = layout,
                             .region_id = setup.region_id,
                             .kind = kind,
                             .memory = setup.memory.layout.base,
                             .bytes = setup.memory.layout.bytes},
        std::move(staging),
        kvtransfer::KvSenderOptions{.transfer_timeout = options.service.transfer_timeout});
    lanes.push_back(TransferLane{.sender = sender.get(), .staged = setup.memory.staged});
    worker->senders_.push_back(std::move(sender));
  }

  worker->metrics_ = std::make_unique<server::WorkerMetricsReporter>(
      engine, /*count_generation=*/false, options.model_name);
  worker->prefill_service_ = std::make_unique<PrefillService>(
      engine, std::move(lanes), &worker->metrics_->metrics(), options.identity, options.service);
  worker->stats_service_ = std::make_unique<server::WorkerStatsService>(
      "prefill", options.model_name, engine, options.identity);
  ASSIGN_OR_RETURN(
      worker->server_,
      server::StartGrpcServer(options.host, options.port,
                              {worker->prefill_service_.get(), worker->stats_service_.get()},
                              {v1::Prefill::service_full_name(), v1::Worker::service_full_name()},
                              options.identity));
  worker->port_ = worker->server_.port;
  return worker;
}

PrefillWorker::~PrefillWorker() { Shutdown(absl::ZeroDuration()); }

std::string PrefillWorker::address() const { return absl::StrCat(host_, ":", port_); }

void PrefillWorker::Shutdown(absl::Duration drain) {
  absl::MutexLock lock(&shutdown_mu_);
  if (stats_service_ != nullptr) stats_service_->Stop();
  // Prompts not admitted yet go back to their decode workers at once (they prefill locally).
  if (prefill_service_ != nullptr) prefill_service_->StopAdmitting();
  server_.Shutdown(drain);
  // Sends that end from now on are not counted; every live send fails and gives its KV back
  // (KV that becomes ready later goes back at once).
  if (prefill_service_ != nullptr) prefill_service_->Detach();
  for (auto& sender : senders_) sender->Stop();
}

}  // namespace tandem::prefill
