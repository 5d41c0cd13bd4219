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
  std::unique_ptr<DecodeWorker> worker(new DecodeWorker());
  worker->engine_ = engine;
  worker->host_ = options.host;
  // Transfers read and write the KV cache itself, or its pinned host mirror when the backend
  // moves only host memory and the cache is on a GPU (transfer_memory.h).
  ASSIGN_OR_RETURN(
      const server::TransferMemory memory,
      server::ChooseTransferMemory(*engine, backend->capabilities(), std::string(backend->name())));
  const KvCacheLayout& layout = memory.layout;

  // This worker's transfer identity, filled on the transfer thread.
  v1::KvTarget target;
  worker->transfer_ = std::make_unique<server::TransferThread>(std::move(backend));
  target.set_backend(worker->transfer_->backend_name());
  RETURN_IF_ERROR(worker->transfer_->Run(
      [&target, &memory](kvtransfer::TransferBackend& b) -> absl::Status {
        ASSIGN_OR_RETURN(kvtransfer::MemoryRegion region,
                         b.RegisterMemory(memory.layout.base, memory.layout.bytes, memory.kind));
        ASSIGN_OR_RETURN(std::string blob, b.ExportRegion(region.id));
        ASSIGN_OR_RETURN(std::string address, b.LocalAddress());
        target.set_agent_name(b.agent_name());
        target.set_agent_address(std::move(address));
        target.set_region(std::move(blob));
        return absl::OkStatus();
      },
      options.setup_timeout));
  server::KvLayoutToProto(server::ToTransferLayout(layout), target.mutable_layout());

  worker->metrics_ = std::make_unique<server::WorkerMetricsReporter>(engine);
  worker->decode_service_ = std::make_unique<DecodeService>(engine, &worker->metrics_->metrics(),
                                                            std::move(target), options.service);
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
  if (transfer_ != nullptr) transfer_->Stop();
}

}  // namespace tandem::decode
