#include "runtime/server/worker_main.h"

#include <signal.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<std::unique_ptr<kvtransfer::TransferBackend>> CreateWorkerBackend(
    const std::string& kind, const std::string& role, const std::string& ucx_transports,
    int cuda_device) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  kvtransfer::BackendOptions options;
  options.agent_name = absl::StrCat(role, "-", host, "-", getpid());
  options.ucx_transports = ucx_transports;
  options.cuda_device = cuda_device;
  return kvtransfer::CreateTransferBackend(kind, options);
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
