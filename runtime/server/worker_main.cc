#include "runtime/server/worker_main.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"

namespace tandem::server {
namespace {

sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<kvtransfer::TransferBackend>>> CreateWorkerBackends(
    const std::string& kind, const std::string& role, const std::string& ucx_transports,
    bool kv_on_device, int cuda_device) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  kvtransfer::BackendOptions options;
  options.agent_name = absl::StrCat(role, "-", host, "-", getpid());
  options.ucx_transports = ucx_transports;
  options.cuda_device = cuda_device;
  std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends;
  if (kind != "auto") {
    ASSIGN_OR_RETURN(auto backend, kvtransfer::CreateTransferBackend(kind, options));
    backends.push_back(std::move(backend));
    return backends;
  }
  if (kv_on_device) {
    auto ipc = kvtransfer::CreateTransferBackend("cuda_ipc", options);
    if (ipc.ok()) {
      backends.push_back(*std::move(ipc));
    } else {
      LOG(WARNING) << role << ": --kv-transfer auto: no cuda_ipc (" << ipc.status()
                   << "); KV moves through ucx and a host mirror";
    }
    // GPU to GPU between hosts, or where CUDA IPC cannot work (DESIGN.md: cuda_ipc, then nccl).
    auto nccl = kvtransfer::CreateTransferBackend("nccl", options);
    if (nccl.ok()) {
      backends.push_back(*std::move(nccl));
    } else {
      LOG(INFO) << role << ": --kv-transfer auto: no nccl (" << nccl.status() << ")";
    }
  }
  ASSIGN_OR_RETURN(auto ucx, kvtransfer::CreateTransferBackend("ucx", options));
  backends.push_back(std::move(ucx));
  return backends;
}

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal;
}

}  // namespace tandem::server
