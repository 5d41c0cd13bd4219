#include "runtime/server/worker_main.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/match.h"
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
    bool kv_on_device, int cuda_device, const std::string& bind_host) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  kvtransfer::BackendOptions options;
  options.agent_name = absl::StrCat(role, "-", host, "-", getpid());
  options.ucx_transports = ucx_transports;
  // A worker bound to loopback keeps UCX's tcp listener on loopback too.
  if (bind_host == "localhost" || absl::StartsWith(bind_host, "127.") || bind_host == "::1") {
    options.ucx_net_devices = "lo";
  }
  options.cuda_device = cuda_device;
  std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends;
  if (kind != "auto") {
    ASSIGN_OR_RETURN(auto backend, kvtransfer::CreateTransferBackend(kind, options));
    backends.push_back(std::move(backend));
    return backends;
  }
  // The registry's preference order; device-memory backends only for a KV cache on a GPU. A
  // backend that cannot be created is skipped, saying why; the pair handshake then picks the
  // first one both sides run.
  absl::Status last = absl::NotFoundError("no backend");
  for (const kvtransfer::BackendEntry& entry : kvtransfer::TransferBackendRegistry()) {
    if (entry.in_process_only || (entry.moves_device_memory && !kv_on_device)) continue;
    absl::StatusOr<std::unique_ptr<kvtransfer::TransferBackend>> backend =
        entry.create != nullptr ? entry.create(options)
                                : absl::UnimplementedError(std::string(entry.missing));
    if (backend.ok()) {
      backends.push_back(*std::move(backend));
      continue;
    }
    last = backend.status();
    LOG(WARNING) << role << ": --kv-transfer auto: no " << entry.name << " (" << backend.status()
                 << ")";
  }
  if (backends.empty()) {
    return absl::Status(last.code(),
                        absl::StrCat("--kv-transfer auto: no backend could be created; the last "
                                     "one said: ",
                                     last.message()));
  }
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
