#include "runtime/server/worker_main.h"

#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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
  // UCX listens only on the interface the worker's gRPC is bound to. With explicit transports
  // (--ucx-transports, e.g. RDMA ones) the devices are UCX's choice: an HCA has no IP address.
  if (ucx_transports.empty()) {
    ASSIGN_OR_RETURN(options.ucx_net_devices, TransferNetDevices(bind_host));
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

absl::StatusOr<std::string> TransferNetDevices(const std::string& bind_host) {
  if (bind_host.empty() || bind_host == "0.0.0.0" || bind_host == "::" || bind_host == "[::]") {
    return std::string();
  }
  if (bind_host == "localhost" || absl::StartsWith(bind_host, "127.") || bind_host == "::1" ||
      bind_host == "[::1]") {
    return std::string("lo");
  }
  std::string host = bind_host;
  if (absl::StartsWith(host, "[") && absl::EndsWith(host, "]"))
    host = host.substr(1, host.size() - 2);
  // The host's addresses (numeric, or a name of this machine).
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* resolved = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &resolved) != 0 || resolved == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host ", bind_host, ": not an address or a name that resolves"));
  }
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) {
    freeaddrinfo(resolved);
    return absl::InternalError("getifaddrs failed");
  }
  const auto same = [](const sockaddr* a, const sockaddr* b) {
    if (a == nullptr || b == nullptr || a->sa_family != b->sa_family) return false;
    if (a->sa_family == AF_INET) {
      return reinterpret_cast<const sockaddr_in*>(a)->sin_addr.s_addr ==
             reinterpret_cast<const sockaddr_in*>(b)->sin_addr.s_addr;
    }
    if (a->sa_family == AF_INET6) {
      return memcmp(&reinterpret_cast<const sockaddr_in6*>(a)->sin6_addr,
                    &reinterpret_cast<const sockaddr_in6*>(b)->sin6_addr, sizeof(in6_addr)) == 0;
    }
    return false;
  };
  std::string device;
  for (const addrinfo* r = resolved; r != nullptr && device.empty(); r = r->ai_next) {
    for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
      if (same(i->ifa_addr, r->ai_addr)) {
        device = i->ifa_name;
        break;
      }
    }
  }
  freeifaddrs(interfaces);
  freeaddrinfo(resolved);
  if (device.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--host ", bind_host, ": no interface of this machine has that address"));
  }
  return device;
}

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal(absl::Duration timeout) {
  sigset_t set = TerminationSignals();
  const int64_t ns = std::max<int64_t>(0, absl::ToInt64Nanoseconds(timeout));
  timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
  const int signal = sigtimedwait(&set, nullptr, &ts);
  return signal > 0 ? signal : 0;
}

std::string WorkerStatsLine(const std::string& role, const EngineStats& now,
                            const EngineStats& previous, absl::Duration elapsed) {
  const double seconds = std::max(1e-3, absl::ToDoubleSeconds(elapsed));
  const double kv_pct = now.blocks_total > 0 ? 100.0 * now.blocks_used / now.blocks_total : 0.0;
  return absl::StrFormat(
      "stats %s: running=%d waiting=%d kv=%d/%d (%.0f%%) generated_tokens/s=%.1f "
      "prompt_tokens_cached/s=%.1f steps/s=%.1f finished=%d",
      role, now.running, now.waiting, now.blocks_used, now.blocks_total, kv_pct,
      (now.generated_tokens - previous.generated_tokens) / seconds,
      (now.prefix_hit_tokens - previous.prefix_hit_tokens) / seconds,
      (now.steps - previous.steps) / seconds,
      static_cast<int>(now.finished_requests - previous.finished_requests));
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal;
}

}  // namespace tandem::server
