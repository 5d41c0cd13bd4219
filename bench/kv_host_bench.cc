// KV between two processes on one host through host memory (the UCX backend): this process
// writes into a kvtransfer_ucx_test_peer process ("idle" mode: it registers a zeroed region and
// progresses its worker), against the ceiling measured in the same run, a same-process memcpy of
// the same bytes.
//
//   kv_host_bench --peer PATH [--transports "tcp,self;tcp,sm,self;"] [--mib 256]
//                 [--block-kib 32] [--iters 10] [--json FILE]
//
// Per transports string (';'-separated; "" = UCX's default choice), two cases: the region as one
// op, and the same bytes as --block-kib ops in shuffled order (a prompt's scattered KV blocks).
// Time: PostWrite to Poll = done (remote completion), median of --iters after one warm-up.
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

// Starts `binary transports bytes 0 idle` and reads its name, address and region blob.
bool StartPeer(const std::string& binary, const std::string& transports, size_t bytes, Peer* p) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return false;
  const std::string bytes_arg = std::to_string(bytes);
  p->pid = fork();
  if (p->pid < 0) return false;
  if (p->pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    execl(binary.c_str(), binary.c_str(), transports.c_str(), bytes_arg.c_str(), "0", "idle",
          static_cast<char*>(nullptr));
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

int Run(const std::string& peer_binary, const std::string& transports_list, size_t mib,
        size_t block_kib, int iters, const std::string& json_path) {
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
  std::printf(
      "kv_host_bench: %zu MiB, %zu KiB blocks; ceiling (same-process memcpy): %.2f ms, "
      "%.2f GB/s\n",
      mib, block_kib, ceiling_ms, bytes / ceiling_ms / 1e6);
  std::printf("%-16s %-10s %8s %10s %10s\n", "transports", "case", "ops", "ms", "GB/s");
  std::string json = absl::StrFormat(
      "{\"mib\": %d, \"block_kib\": %d, \"ceiling_ms\": %.3f, "
      "\"cases\": [",
      mib, block_kib, ceiling_ms);
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
  const std::vector<std::string> transport_list = absl::StrSplit(transports_list, ';');
  for (const std::string& transports : transport_list) {
    Peer peer;
    if (!StartPeer(peer_binary, transports, bytes, &peer)) {
      std::fprintf(stderr, "kv_host_bench: peer did not start (transports '%s')\n",
                   transports.c_str());
      return 1;
    }
    BackendOptions options;
    options.agent_name = absl::StrCat("kv-host-bench-", getpid());
    options.ucx_transports = transports;
    auto backend = CreateTransferBackend("ucx", options);
    if (!backend.ok()) return 1;
    auto region = (*backend)->RegisterMemory(src.data(), bytes, MemoryKind::kHost);
    if (!region.ok() || !(*backend)->Connect(peer.name, peer.address).ok()) {
      std::fprintf(stderr, "kv_host_bench: register/connect failed\n");
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
        do {
          state = (*backend)->Poll(*h);
        } while (state.ok() && *state == TransferState::kInProgress &&
                 absl::Now() - t0 < absl::Seconds(10));
        if (!state.ok() || *state != TransferState::kDone) {
          std::fprintf(stderr, "kv_host_bench: transfer did not finish\n");
          return 1;
        }
        if (i > 0) ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - t0));
        (void)(*backend)->Release(*h);
      }
      const double m = Median(ms);
      const std::string label = transports.empty() ? "(default)" : transports;
      std::printf("%-16s %-10s %8zu %10.2f %10.2f\n", label.c_str(), name.c_str(), ops->size(), m,
                  bytes / m / 1e6);
      json += absl::StrFormat(
          "%s{\"transports\": \"%s\", \"case\": \"%s\", \"ops\": %d, "
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
  std::string peer, transports = "tcp,self;tcp,sm,self;", json;
  size_t mib = 256, block_kib = 32;
  int iters = 10;
  CLI::App app{"KV through host memory between two processes (UCX)"};
  app.add_option("--peer", peer, "kvtransfer_ucx_test_peer binary")->required();
  app.add_option("--transports", transports, "';'-separated UCX_TLS strings (\"\" = default)");
  app.add_option("--mib", mib, "bytes per transfer, MiB")->check(CLI::PositiveNumber);
  app.add_option("--block-kib", block_kib, "scattered block size, KiB")->check(CLI::PositiveNumber);
  app.add_option("--iters", iters, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("--json", json, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  return tandem::kvtransfer::Run(peer, transports, mib, block_kib, iters, json);
}
