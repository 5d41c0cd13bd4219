#include "prefill/prefill_worker.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem::prefill {

absl::StatusOr<std::unique_ptr<PrefillWorker>> PrefillWorker::Create(
    Engine* engine, std::unique_ptr<kvtransfer::TransferBackend> backend,
    const PrefillWorkerOptions& options) {
  std::unique_ptr<PrefillWorker> worker(new PrefillWorker());
  worker->host_ = options.host;
  // Transfers read and write the engine's transfer memory: the KV cache itself on the CPU, its
  // pinned host mirror on a GPU (allocated now; the engine stages blocks through it).
  ASSIGN_OR_RETURN(const KvCacheLayout layout, engine->transfer_layout());
  worker->transfer_ = std::make_unique<server::TransferThread>(std::move(backend));
  uint64_t region_id = 0;
  RETURN_IF_ERROR(worker->transfer_->Run(
      [&region_id, layout](kvtransfer::TransferBackend& b) -> absl::Status {
        ASSIGN_OR_RETURN(
            kvtransfer::MemoryRegion region,
            b.RegisterMemory(layout.base, layout.bytes, kvtransfer::MemoryKind::kHost));
        region_id = region.id;
        return absl::OkStatus();
      },
      options.setup_timeout));

  worker->metrics_ = std::make_unique<server::WorkerMetricsReporter>(engine);
  worker->prefill_service_ = std::make_unique<PrefillService>(
      engine, worker->transfer_.get(), region_id, &worker->metrics_->metrics(), options.service);
  worker->stats_service_ =
      std::make_unique<server::WorkerStatsService>("prefill", options.model_name, engine);
  ASSIGN_OR_RETURN(
      worker->server_,
      server::StartGrpcServer(options.host, options.port,
                              {worker->prefill_service_.get(), worker->stats_service_.get()},
                              {v1::Prefill::service_full_name(), v1::Worker::service_full_name()}));
  worker->port_ = worker->server_.port;
  return worker;
}

PrefillWorker::~PrefillWorker() { Shutdown(absl::ZeroDuration()); }

std::string PrefillWorker::address() const { return absl::StrCat(host_, ":", port_); }

void PrefillWorker::Shutdown(absl::Duration drain) {
  absl::MutexLock lock(&shutdown_mu_);
  if (stats_service_ != nullptr) stats_service_->Stop();
  server_.Shutdown(drain);
  // KV that becomes ready from now on is released at once; live transfers are released by the
  // transfer thread's last poll.
  if (prefill_service_ != nullptr) prefill_service_->Detach();
  if (transfer_ != nullptr) transfer_->Stop();
}

}  // namespace tandem::prefill
