// KV between two processes on one host through host memory (the UCX or the cma backend): this
// process writes into a peer process in "idle" mode (kvtransfer_ucx_test_peer: registers a zeroed
// region and progresses its worker; kvtransfer_cma_test_peer: registers a zeroed region and
// sleeps), against the ceiling measured in the same run, a same-process memcpy of the same bytes
// (one thread, and split over two threads for reference).
//
//   kv_host_bench --peer PATH [--backend ucx|cma] [--transports "tcp,self;tcp,sm,self;"]
//                 [--cma-threads 2] [--poll-us 0] [--mib 256] [--block-kib 32] [--iters 10]
//                 [--json FILE]
//
// ucx: per transports string (';'-separated; "" = UCX's default choice); cma: per --cma-threads
// value (a list). Two cases each: the region as one op, and the same bytes as --block-kib ops in
// shuffled order (a prompt's scattered KV blocks). Time: PostWrite to Poll = done (remote
// completion), median of --iters after one warm-up; Poll in a busy loop, or every --poll-us
// microseconds (as the product's transfer thread ticks, 50 us) when > 0.
// Exit status 1 on any failure.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {
namespace {

struct Peer {
  pid_t pid = -1;
  int out = -1;
  std::string name, address, region;
  ~Peer() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out >= 0) close(out);
  }
};

bool ReadAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool ReadField(int fd, std::string* field) {
  uint32_t n = 0;
  if (!ReadAll(fd, &n, sizeof(n)) || n > (1u << 20)) return false;
  field->resize(n);
  return ReadAll(fd, field->data(), n);
}

// Starts the idle peer (ucx: `binary transports bytes 0 idle`; cma: `binary bytes idle`) and
// reads its name, address and region blob.
bool StartPeer(const std::string& binary, const std::string& backend, const std::string& transports,
               size_t bytes, Peer* p) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return false;
  const std::string bytes_arg = std::to_string(bytes);
  p->pid = fork();
  if (p->pid < 0) return false;
  if (p->pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    if (backend == "cma") {
      execl(binary.c_str(), binary.c_str(), bytes_arg.c_str(), "idle", static_cast<char*>(nullptr));
    } else {
      execl(binary.c_str(), binary.c_str(), transports.c_str(), bytes_arg.c_str(), "0", "idle",
            static_cast<char*>(nullptr));
    }
    _exit(127);
  }
  close(pipe_fds[1]);
  p->out = pipe_fds[0];
  return ReadField(p->out, &p->name) && ReadField(p->out, &p->address) &&
         ReadField(p->out, &p->region);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One configuration to measure: a UCX transports string, or a cma thread count.
struct Config {
  std::string label;
  std::string transports;
  int cma_threads = 0;
};

int Run(const std::string& peer_binary, const std::string& backend_name,
        const std::string& transports_list, const std::vector<int>& cma_threads, int poll_us,
        size_t mib, size_t block_kib, int iters, const std::string& json_path) {
  const size_t bytes = mib << 20, block = block_kib << 10;
  std::vector<uint8_t> src(bytes), dst(bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t r = rng();
    std::memcpy(src.data() + i, &r, 8);
  }
  std::vector<double> copy_ms;
  for (int i = 0; i < iters + 1; ++i) {
    const absl::Time t0 = absl::Now();
    std::memcpy(dst.data(), src.data(), bytes);
    if (i > 0) copy_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  const double ceiling_ms = Median(copy_ms);
  // The same copy split over two threads (each half on its own thread): for reference only.
  std::vector<double> copy2_ms;
  for (int i = 0; i < iters + 1; ++i) {
    const absl::Time t0 = absl::Now();
    std::thread half([&] { std::memcpy(dst.data(), src.data(), bytes / 2); });
    std::memcpy(dst.data() + bytes / 2, src.data() + bytes / 2, bytes - bytes / 2);
    half.join();
    if (i > 0) copy2_ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
  }
  const double ceiling2_ms = Median(copy2_ms);
  std::printf(
      "kv_host_bench: %s, %zu MiB, %zu KiB blocks, poll %s; ceiling (same-process memcpy): "
      "%.2f ms, %.2f GB/s (two threads: %.2f ms, %.2f GB/s)\n",
      backend_name.c_str(), mib, block_kib,
      poll_us > 0 ? absl::StrCat("every ", poll_us, " us").c_str() : "busy", ceiling_ms,
      bytes / ceiling_ms / 1e6, ceiling2_ms, bytes / ceiling2_ms / 1e6);
  std::printf("%-16s %-10s %8s %10s %10s\n", backend_name == "cma" ? "cma" : "transports", "case",
              "ops", "ms", "GB/s");
  std::string json = absl::StrFormat(
      "{\"backend\": \"%s\", \"mib\": %d, \"block_kib\": %d, \"poll_us\": %d, "
      "\"ceiling_ms\": %.3f, \"ceiling_two_threads_ms\": %.3f, \"cases\": [",
      backend_name, mib, block_kib, poll_us, ceiling_ms, ceiling2_ms);
  std::vector<CopyOp> one = {{.local_offset = 0, .remote_offset = 0, .length = bytes}};
  std::vector<CopyOp> scattered;
  std::vector<size_t> order(bytes / block);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i = 0; i < order.size(); ++i) {
    scattered.push_back({.local_offset = order[i] * block,
                         .remote_offset = ((i * 7919) % order.size()) * block,
                         .length = block});
  }
  bool first_case = true;
  std::vector<Config> configs;
  if (backend_name == "cma") {
    for (int threads : cma_threads) {
      configs.push_back({.label = absl::StrCat(threads, " thread", threads == 1 ? "" : "s"),
                         .transports = "",
                         .cma_threads = threads});
    }
  } else {
    for (absl::string_view t : absl::StrSplit(transports_list, ';')) {
      const std::string transports(t);
      configs.push_back({.label = transports.empty() ? "(default)" : transports,
                         .transports = transports,
                         .cma_threads = 0});
    }
  }
  for (const Config& config : configs) {
    Peer peer;
    if (!StartPeer(peer_binary, backend_name, config.transports, bytes, &peer)) {
      std::fprintf(stderr, "kv_host_bench: peer did not start (%s)\n", config.label.c_str());
      return 1;
    }
    BackendOptions options;
    options.agent_name = absl::StrCat("kv-host-bench-", getpid());
    options.ucx_transports = config.transports;
    if (config.cma_threads > 0) options.cma_threads = config.cma_threads;
    auto backend = CreateTransferBackend(backend_name, options);
    if (!backend.ok()) {
      std::fprintf(stderr, "kv_host_bench: %s\n", std::string(backend.status().message()).c_str());
      return 1;
    }
    auto region = (*backend)->RegisterMemory(src.data(), bytes, MemoryKind::kHost);
    absl::Status connected =
        region.ok() ? (*backend)->Connect(peer.name, peer.address) : region.status();
    if (!connected.ok()) {
      std::fprintf(stderr, "kv_host_bench: register/connect failed: %s\n",
                   std::string(connected.message()).c_str());
      return 1;
    }
    for (const auto& [name, ops] : std::vector<std::pair<std::string, const std::vector<CopyOp>*>>{
             {"one op", &one}, {"scattered", &scattered}}) {
      std::vector<double> ms;
      for (int i = 0; i < iters + 1; ++i) {
        const absl::Time t0 = absl::Now();
        auto h = (*backend)->PostWrite({.local_region = region->id,
                                        .peer = peer.name,
                                        .remote_region = peer.region,
                                        .ops = *ops,
                                        .notification = ""});
        if (!h.ok()) return 1;
        absl::StatusOr<TransferState> state;
        while (true) {
          state = (*backend)->Poll(*h);
          if (!state.ok() || *state != TransferState::kInProgress ||
              absl::Now() - t0 >= absl::Seconds(10)) {
            break;
          }
          if (poll_us > 0) absl::SleepFor(absl::Microseconds(poll_us));
        }
        if (!state.ok() || *state != TransferState::kDone) {
          std::fprintf(stderr, "kv_host_bench: transfer did not finish\n");
          return 1;
        }
        if (i > 0) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
        (void)(*backend)->Release(*h);
      }
      const double m = Median(ms);
      const std::string& label = config.label;
      std::printf("%-16s %-10s %8zu %10.2f %10.2f\n", label.c_str(), name.c_str(), ops->size(), m,
                  bytes / m / 1e6);
      json += absl::StrFormat(
          "%s{\"config\": \"%s\", \"case\": \"%s\", \"ops\": %d, "
          "\"ms\": %.3f, \"gbs\": %.2f}",
          first_case ? "" : ", ", label, name, ops->size(), m, bytes / m / 1e6);
      first_case = false;
    }
    (void)(*backend)->Disconnect(peer.name);
  }
  json += "]}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  std::string peer, backend = "ucx", transports = "tcp,self;tcp,sm,self;", json;
  std::vector<int> cma_threads = {2};
  size_t mib = 256, block_kib = 32;
  int iters = 10, poll_us = 0;
  CLI::App app{"KV through host memory between two processes (UCX or cma)"};
  app.add_option("--peer", peer,
                 "the backend's idle peer binary (kvtransfer_ucx_test_peer, "
                 "kvtransfer_cma_test_peer)")
      ->required();
  app.add_option("--backend", backend, "the transfer backend")
      ->check(CLI::IsMember({"ucx", "cma"}));
  app.add_option("--transports", transports, "ucx: ';'-separated UCX_TLS strings (\"\" = default)");
  app.add_option("--cma-threads", cma_threads, "cma: copy thread counts to measure (e.g. 1,2,4)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--poll-us", poll_us, "sleep between polls, us (0: busy loop)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--mib", mib, "bytes per transfer, MiB")->check(CLI::PositiveNumber);
  app.add_option("--block-kib", block_kib, "scattered block size, KiB")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("--json", json, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  return tandem::kvtransfer::Run(peer, backend, transports, cma_threads, poll_us, mib, block_kib,
                                 iters, json);
}
