// `tandem serve`: the whole disaggregated stack on this machine, as separate processes.
//   tandem serve [--model DIR] [--prefill-workers N] [--decode-workers M] [--port 8000]
//                [--host 127.0.0.1] [--aggregated]
//                [--kv-transfer auto|cuda_ipc|nccl|cma|ucx|loopback]
//                [--device cpu|cuda|cuda:N] [--prefill-device D] [--decode-device D]
//                [--block-size N] [--kv-cache-mib M] [--cuda-tuning KEY=VALUE,...]
//                [--routing least-loaded|round-robin|kv-aware] [--local-prefill-threshold N]
//                [--kv-aware-request-cost N] [--kv-aware-replicate-weight W]
//                [--chat-template FILE] [--generation-config auto|vllm|none|DIR]
//                [--tool-call-parser auto|hermes|llama3_json|none]
//                [--speculative ngram|draft:DIR|remote:ADDR,...|remote [--num-speculative-tokens
//                K]]
//                [--drafters N [--drafter ngram|draft:DIR]]   (with --speculative remote)
//                [--mlp local|cpu|remote:ADDR,...|remote [--mlp-shards N] [--mlp-fallback cpu]
//                 [--mlp-call-timeout-ms T] [--mlp-micro-batches N]
//                 [--mlp-data-plane grpc|cma|ucx]]
// Starts N `tandem prefill` and M `tandem decode` workers (this same binary, /proc/self/exe) on
// free localhost ports, waits for each one's readiness line, then starts `tandem router` naming
// them and waits for its readiness line; prints "Tandem is serving MODEL at URL". Every child's
// stdout/stderr is forwarded line by line with a "[router]", "[prefill-0]", "[decode-0]" prefix.
// SIGINT/SIGTERM: the router is stopped first, then the workers (SIGTERM, then SIGKILL after
// --stop-timeout-s). A child that dies unexpectedly is reported and started again after a backoff
// (same arguments, same port) while the rest keep serving; more than --max-restarts crashes in a
// row of one child stop everything (exit 1).
// Children run in their own process group (a terminal's Ctrl-C reaches only serve, which stops
// them in order) and get PR_SET_PDEATHSIG(SIGKILL): none outlives serve, even a SIGKILLed one.
// --aggregated: no prefill workers; decode workers prefill locally (the baseline).
// --speculative remote --drafters N: N `tandem drafter` services are started first (supervised
// like the workers) and every decode worker drafts through them (docs/speculative.md).
// --mlp remote --mlp-shards N: N `tandem mlp-shard` services, each loading a contiguous range
// of the layers' MLP weights, are started first, and every decode worker runs its MLP on them
// (docs/mlp.md): on the CPU with rows in the gRPC message, or, for decode workers on a GPU, on
// that GPU (`--device cuda[:N]`) over the GPU data plane (`--mlp cuda_ipc:...`; no fallback).
// --device, --kv-cache-mib and --cuda-tuning go to every worker (all of them on that one GPU for
// cuda[:N]; a CPU worker ignores --cuda-tuning, and a bad one is a usage error before anything
// starts);
// --prefill-device / --decode-device place one pool elsewhere (e.g. prefill on the GPU, decode
// on CPUs: the pair handshake converts the KV between their layouts).
// Default model: models/target when present, else a random-weight tiny model created once under
// $XDG_CACHE_HOME/tandem/models/tiny (or BUILD_DIR/models/tiny beside the binary).
// Service identity: with none of --service-token-file / --tls-* / --insecure-services, serve
// makes a fresh 256-bit token in a file only this user can read (a 0700 directory under $TMPDIR),
// hands it to every child with --service-token-file (a restarted child reads it again), and
// removes it when serve exits. So the local stack is authenticated by default: a local process that
// cannot read that file cannot call any worker. Given flags are passed through unchanged.
// Exit status: 0 after a clean stop on a signal, 1 runtime error, 2 usage error.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cli/access_flags.h"
#include "cli/commands.h"
#include "nlohmann/json.hpp"
#include "runtime/base/secrets.h"
#include "runtime/model/runner_factory.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

// A TCP port free on 127.0.0.1 right now (bound to port 0, read back, released).
absl::StatusOr<int> FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::InternalError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    const std::string error = std::strerror(errno);
    close(fd);
    return absl::InternalError(absl::StrCat("bind: ", error));
  }
  close(fd);
  return ntohs(addr.sin_port);
}

// A fresh service token in `*dir` (a new 0700 directory) as a 0600 file; returns its path.
absl::StatusOr<std::string> WriteServiceToken(std::string* dir) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/tandem-serve-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp: ", std::strerror(errno)));
  }
  *dir = pattern;
  absl::StatusOr<std::string> token = RandomHex(32);
  if (!token.ok()) return token.status();
  const std::string path = absl::StrCat(pattern, "/service-token");
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrCat(path, ": ", std::strerror(errno)));
  const std::string line = absl::StrCat(*token, "\n");
  const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!written) return absl::InternalError(absl::StrCat("writing ", path, " failed"));
  return path;
}

struct ServeFlags {
  std::string model_dir;
  int prefill_workers = 1;
  int decode_workers = 1;
  int port = 8000;
  std::string host = "127.0.0.1";
  bool aggregated = false;
  std::string kv_transfer = "auto";
  std::string device = "cpu";
  std::string prefill_device;              // "" = device
  std::string decode_device;               // "" = device (decode and aggregated workers)
  int block_size = 0;                      // 0: the workers' default
  int kv_cache_mib = 0;                    // 0: the workers' default
  std::string cuda_tuning;                 // every worker; "": their default plan
  int max_num_batched_tokens = 0;          // decode (and aggregated) workers; 0: their default
  int prefill_max_num_batched_tokens = 0;  // prefill workers; 0: their default
  int long_prefill_token_threshold = 0;    // every worker
  std::string kv_streaming = "on";         // prefill workers
  std::string kv_verify = "off";           // decode workers
  std::string speculative;                 // decode workers; "": off; "remote": our drafters
  int num_speculative_tokens = 4;          // decode workers
  int drafters = 0;                        // `tandem drafter` services (--speculative remote)
  std::string drafter = "ngram";           // what they run
  std::string mlp = "local";               // decode workers: local, cpu, remote:ADDR,... or
                                           // "remote": our --mlp-shards
  int mlp_shards = 0;                      // `tandem mlp-shard` services (--mlp remote)
  std::string mlp_fallback = "none";       // with --mlp remote: none or cpu
  int mlp_micro_batches = 0;             // with --mlp remote: ping-pong micro-batches (0: measured)
  int mlp_call_timeout_ms = 2000;        // with --mlp remote: one layer's call
  std::string mlp_data_plane = "grpc";   // with --mlp remote: grpc, cma or ucx
  int64_t admission_window_tokens = -1;  // prefill workers; -1: theirs
  std::string two_phase_admission = "on";  // decode workers
  AccessFlags access;                      // the router's
  ServiceAuthFlags service_auth;           // every child's; none given: a fresh token
  std::string log_format = "text";         // every child's, and serve's own lines
  std::string routing = "kv-aware";
  int local_prefill_threshold = 0;
  double kv_aware_request_cost = -1;      // -1: the router's default
  double kv_aware_replicate_weight = -1;  // -1: the router's default
  FrontendModelFlags frontend;
  double startup_timeout_s = 300;
  double stop_timeout_s = 10;
  int max_restarts = 5;          // consecutive crashes of one child before serve gives up
  double drain_seconds = 5;      // the router's and the workers' on stop
  double request_timeout_s = 0;  // the router's per-request deadline; 0: none
};

// One write per line so lines from different children never interleave.
absl::Mutex output_mu;
// --log-format json: children's lines are forwarded as JSON objects with a "process" field.
bool json_output = false;
void WriteLine(FILE* out, const std::string& line) {
  absl::MutexLock lock(&output_mu);
  fwrite(line.data(), 1, line.size(), out);
  fflush(out);
}
void Say(const std::string& message) {
  WriteLine(stderr, json_output ? absl::StrCat(
                                      "{\"process\":\"serve\",\"msg\":",
                                      nlohmann::json(message).dump(
                                          -1, ' ', false, nlohmann::json::error_handler_t::replace),
                                      "}\n")
                                : absl::StrCat("[serve] ", message, "\n"));
}

// A child process and the threads forwarding its output.
struct Child {
  std::string name;
  std::vector<std::string> args;  // to start it again
  absl::Time started = absl::InfinitePast();
  pid_t pid = -1;
  std::vector<std::thread> forwarders;
  bool reaped = false;
  int wait_status = 0;

  absl::Mutex mu;
  bool ready ABSL_GUARDED_BY(mu) = false;
  std::string ready_address ABSL_GUARDED_BY(mu);  // what followed "serving on "
};

// Reads `fd` line by line, writes each line to `out` with "[name] ", and marks the child ready
// on its first "<...>: serving on <address>" line. Returns at EOF (the child exited).
void Forward(Child* child, int fd, FILE* out) {
  std::string pending;
  char buf[4096];
  const auto emit = [&](const std::string& line) {
    if (json_output) {
      // A child's JSON log line gets a "process" field; any other line becomes one.
      const std::string process = nlohmann::json(child->name).dump();
      WriteLine(out,
                !line.empty() && line.front() == '{' && line.back() == '}'
                    ? absl::StrCat("{\"process\":", process, ",", line.substr(1), "\n")
                    : absl::StrCat("{\"process\":", process, ",\"msg\":",
                                   nlohmann::json(line).dump(
                                       -1, ' ', false, nlohmann::json::error_handler_t::replace),
                                   "}\n"));
    } else {
      WriteLine(out, absl::StrCat("[", child->name, "] ", line, "\n"));
    }
    const size_t at = line.find(": serving on ");
    if (at == std::string::npos) return;
    std::string address = line.substr(at + 13);
    address = address.substr(0, address.find(' '));
    absl::MutexLock lock(&child->mu);
    if (!child->ready) {
      child->ready = true;
      child->ready_address = address;
    }
  };
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    pending.append(buf, static_cast<size_t>(n));
    size_t newline;
    while ((newline = pending.find('\n')) != std::string::npos) {
      emit(pending.substr(0, newline));
      pending.erase(0, newline + 1);
    }
  }
  if (!pending.empty()) emit(pending);
  close(fd);
}

// Starts `exe args...` as a child whose stdout/stderr are forwarded with its name. The child gets
// the default signal mask and dispositions, its own process group, and SIGKILL when serve dies.
absl::StatusOr<std::unique_ptr<Child>> Spawn(const std::string& exe, const std::string& name,
                                             const std::vector<std::string>& args) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) return absl::InternalError(strerror(errno));
  if (pipe2(err_pipe, O_CLOEXEC) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    return absl::InternalError(strerror(errno));
  }
  // Everything the child needs is prepared before fork: after it, only async-signal-safe calls.
  std::vector<std::string> argv_storage = {exe};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) close(fd);
    return absl::InternalError(absl::StrCat("fork: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // serve died before prctl took effect
    setpgid(0, 0);
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);  // ignored in serve; ignored dispositions survive exec
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  auto child = std::make_unique<Child>();
  child->name = name;
  child->pid = pid;
  Child* raw = child.get();
  child->forwarders.emplace_back(Forward, raw, out_pipe[0], stdout);
  child->forwarders.emplace_back(Forward, raw, err_pipe[0], stderr);
  return child;
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return "stopped";
}

bool Reap(Child& child, int flags) {
  if (child.reaped) return true;
  int status = 0;
  pid_t r;
  do {
    r = waitpid(child.pid, &status, flags);
  } while (r < 0 && errno == EINTR);
  if (r == child.pid || (r < 0 && errno == ECHILD)) {
    child.reaped = true;
    child.wait_status = status;
    for (std::thread& t : child.forwarders) t.join();
    child.forwarders.clear();
    return true;
  }
  return false;
}

class Supervisor {
 public:
  explicit Supervisor(std::string exe) : exe_(std::move(exe)) {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
  }
  ~Supervisor() { StopAll(absl::Seconds(5)); }

  // Blocks SIGINT/SIGTERM in this process (WaitForSignal takes them).
  void BlockSignals() {
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    ::signal(SIGPIPE, SIG_IGN);
  }

  absl::StatusOr<Child*> Start(const std::string& name, const std::vector<std::string>& args) {
    auto child = Spawn(exe_, name, args);
    if (!child.ok()) return child.status();
    (*child)->args = args;
    (*child)->started = absl::Now();
    children_.push_back(*std::move(child));
    return children_.back().get();
  }

  // Starts `dead` (reaped) again with the same name and arguments, in its place.
  absl::StatusOr<Child*> Restart(Child* dead) {
    for (auto& slot : children_) {
      if (slot.get() != dead) continue;
      auto child = Spawn(exe_, dead->name, dead->args);
      if (!child.ok()) return child.status();
      (*child)->args = dead->args;
      (*child)->started = absl::Now();
      for (std::thread& t : slot->forwarders) t.join();  // EOF came with the exit
      slot = *std::move(child);
      return slot.get();
    }
    return absl::NotFoundError(absl::StrCat("no child ", dead->name));
  }

  // Sleeps up to `timeout`; true when SIGINT/SIGTERM arrived.
  bool WaitForSignal(absl::Duration timeout) {
    const int64_t ns = absl::ToInt64Nanoseconds(timeout);
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    const int sig = sigtimedwait(&signals_, nullptr, &ts);
    if (sig > 0) signal_ = sig;
    return sig > 0;
  }
  int signal() const { return signal_; }

  // A child that exited (reaped now), or nullptr.
  Child* FindExited() {
    for (auto& child : children_) {
      if (!child->reaped && Reap(*child, WNOHANG)) return child.get();
    }
    return nullptr;
  }

  // Waits until every one of `children` is ready. Errors: a child exited, a signal came
  // (Cancelled), or the deadline passed.
  absl::Status WaitReady(const std::vector<Child*>& children, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      bool all = true;
      for (Child* child : children) {
        absl::MutexLock lock(&child->mu);
        all = all && child->ready;
      }
      if (all) return absl::OkStatus();
      if (Child* dead = FindExited(); dead != nullptr) {
        return absl::AbortedError(
            absl::StrCat(dead->name, " ", DescribeExit(dead->wait_status), " while starting"));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat(
            "not ready within ", absl::FormatDuration(timeout), " (see the output above)"));
      }
      if (WaitForSignal(absl::Milliseconds(50))) return absl::CancelledError("signal");
    }
  }

  // Stops the children started last first (the router before the workers it talks to): SIGTERM,
  // wait up to `timeout`, SIGKILL, reap.
  void StopAll(absl::Duration timeout) {
    std::vector<Child*> router;
    std::vector<Child*> workers;
    for (auto& child : children_) {
      (child->name == "router" ? router : workers).push_back(child.get());
    }
    StopGroup(router, timeout);
    StopGroup(workers, timeout);
  }

 private:
  void StopGroup(const std::vector<Child*>& group, absl::Duration timeout) {
    for (Child* child : group) {
      if (!child->reaped) kill(child->pid, SIGTERM);
    }
    const absl::Time deadline = absl::Now() + timeout;
    for (Child* child : group) {
      while (!Reap(*child, WNOHANG) && absl::Now() < deadline) {
        absl::SleepFor(absl::Milliseconds(20));
      }
      if (!child->reaped) {
        Say(absl::StrCat(child->name, " did not stop within ", absl::FormatDuration(timeout),
                         "; killing it"));
        kill(child->pid, SIGKILL);
        Reap(*child, 0);
      }
    }
  }

  const std::string exe_;
  sigset_t signals_;
  int signal_ = 0;
  std::vector<std::unique_ptr<Child>> children_;
};

std::string SelfExe() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("/proc/self/exe") : exe.string();
}

// The model to serve when --model is not given; creates the tiny model on first use.
absl::StatusOr<std::string> DefaultModel(const std::string& exe) {
  if (fs::exists("models/target/config.json")) return std::string("models/target");
  fs::path dir;
  if (const char* cache = std::getenv("XDG_CACHE_HOME"); cache != nullptr && *cache != '\0') {
    dir = fs::path(cache) / "tandem" / "models" / "tiny";
  } else {
    dir = fs::path(exe).parent_path() / "models" / "tiny";
  }
  if (fs::exists(dir / "config.json")) return dir.string();
  Say(absl::StrCat("no bundled model (models/target); creating a random-weight tiny model in ",
                   dir.string(), " (its text is gibberish)"));
  auto child = Spawn(exe, "model",
                     {"model", "synth", "--like", "tiny", "--out", dir.string(), "--seed", "0"});
  if (!child.ok()) return child.status();
  Reap(**child, 0);
  const int status = (*child)->wait_status;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError(absl::StrCat("tandem model synth ", DescribeExit(status)));
  }
  return dir.string();
}

// Port from "host:port" or "http://host:port/v1".
std::string PortOf(const std::string& address) {
  std::string rest = address;
  if (size_t scheme = rest.find("://"); scheme != std::string::npos) rest = rest.substr(scheme + 3);
  rest = rest.substr(0, rest.find('/'));
  return rest.substr(rest.rfind(':') + 1);
}

int RunServe(ServeFlags flags) {
  json_output = flags.log_format == "json";
  ApplyLogFormat(flags.log_format);
  if (flags.prefill_device.empty()) flags.prefill_device = flags.device;
  if (flags.decode_device.empty()) flags.decode_device = flags.device;
  // A device this build or name cannot give is a usage error, found before anything starts.
  for (const auto& [flag, name] :
       {std::pair<const char*, const std::string&>{"--prefill-device", flags.prefill_device},
        {"--decode-device", flags.decode_device}}) {
    absl::StatusOr<RunnerDevice> device = ParseRunnerDevice(name);
    if (!device.ok()) {
      std::cerr << "tandem serve: " << flag << ": " << device.status().message() << "\n";
      return 2;
    }
    if (device->cuda && !CudaRunnerCompiledIn()) {
      std::cerr << "tandem serve: " << flag << " " << name
                << ": this build of Tandem has no CUDA runner (configure with -DTANDEM_CUDA=ON "
                   "and a CUDA toolkit)\n";
      return 2;
    }
  }
  if (flags.mlp_shards > 0 && absl::StartsWith(flags.decode_device, "cuda") &&
      flags.mlp_fallback != "none") {
    std::cerr << "tandem serve: --mlp-fallback " << flags.mlp_fallback
              << ": decode workers on a GPU reach their shards over the GPU data plane "
                 "(cuda_ipc), which has no fallback (docs/mlp.md)\n";
    return 2;
  }
  if (flags.mlp_data_plane != "grpc" &&
      (!absl::StartsWith(flags.mlp, "remote") || absl::StartsWith(flags.decode_device, "cuda"))) {
    std::cerr << "tandem serve: --mlp-data-plane " << flags.mlp_data_plane
              << " moves host activations to MLP shards: it needs --mlp remote with decode "
                 "workers on the CPU (on a GPU, shards use the GPU data plane)\n";
    return 2;
  }
  if ((flags.mlp == "remote") != (flags.mlp_shards > 0)) {
    std::cerr << "tandem serve: --mlp remote and --mlp-shards N go together (remote:ADDR names "
                 "shards serve does not start)\n";
    return 2;
  }
  if ((flags.speculative == "remote") != (flags.drafters > 0)) {
    std::cerr << "tandem serve: --speculative remote and --drafters N go together (remote:ADDR "
                 "names drafters serve does not start)\n";
    return 2;
  }
  const std::string exe = SelfExe();
  Supervisor supervisor(exe);
  supervisor.BlockSignals();

  if (flags.model_dir.empty()) {
    auto model = DefaultModel(exe);
    if (!model.ok()) {
      std::cerr << "tandem serve: " << model.status().message() << "\n";
      return 1;
    }
    flags.model_dir = *model;
  }
  const int num_prefill = flags.aggregated ? 0 : flags.prefill_workers;
  Say(absl::StrCat(
      "starting ", num_prefill, " prefill + ", flags.decode_workers, " decode workers on ",
      flags.model_dir, flags.aggregated ? " (aggregated)" : "", ", device ",
      flags.prefill_device == flags.decode_device
          ? flags.decode_device
          : absl::StrCat(flags.prefill_device, " (prefill) / ", flags.decode_device, " (decode)"),
      ", KV transfer ", flags.kv_transfer));

  const auto stop = [&](int code) {
    supervisor.StopAll(absl::Seconds(flags.drain_seconds + flags.stop_timeout_s));
    return code;
  };
  // The service identity every child gets.
  std::string secret_dir;
  const auto remove_secret = [&secret_dir] {
    if (secret_dir.empty()) return;
    std::error_code ignored;
    fs::remove_all(secret_dir, ignored);
    secret_dir.clear();
  };
  absl::Cleanup remove_secret_on_exit = remove_secret;
  if (!flags.service_auth.any()) {
    absl::StatusOr<std::string> path = WriteServiceToken(&secret_dir);
    if (!path.ok()) {
      std::cerr << "tandem serve: a service token: " << path.status().message() << "\n";
      return stop(1);
    }
    flags.service_auth.token_file = *path;
  } else if (absl::StatusOr<std::shared_ptr<const auth::ServiceIdentity>> given =
                 MakeServiceIdentity(flags.service_auth);
             !given.ok()) {
    std::cerr << "tandem serve: " << given.status().message() << "\n";
    return stop(2);
  }
  std::vector<std::string> service_args = flags.service_auth.Args();
  service_args.insert(service_args.end(), {"--log-format", flags.log_format});
  service_args.insert(service_args.end(), {"--drain-seconds", absl::StrCat(flags.drain_seconds)});
  // Helper services first (drafters for --speculative remote, MLP shards for --mlp remote):
  // the decode workers are told their addresses. Their ports are picked here so a restarted one
  // comes back where the workers look. Returns their addresses; nullopt after a failure (or a
  // signal) with `exit_code` set.
  int exit_code = 0;
  const auto start_helpers =
      [&](const std::string& kind, int count,
          const std::function<std::vector<std::string>(int index, int port)>& args_of)
      -> std::optional<std::vector<std::string>> {
    std::vector<std::string> addresses;
    std::vector<Child*> children;
    for (int i = 0; i < count; ++i) {
      absl::StatusOr<int> port = FreeLoopbackPort();
      if (!port.ok()) {
        std::cerr << "tandem serve: a port for " << kind << " " << i << ": "
                  << port.status().message() << "\n";
        exit_code = stop(1);
        return std::nullopt;
      }
      std::vector<std::string> args = args_of(i, *port);
      args.insert(args.end(), {"--log-format", flags.log_format});
      const std::vector<std::string> auth = flags.service_auth.Args();
      args.insert(args.end(), auth.begin(), auth.end());
      const std::string name = absl::StrCat(kind, "-", i);
      auto child = supervisor.Start(name, args);
      if (!child.ok()) {
        std::cerr << "tandem serve: starting " << name << ": " << child.status().message() << "\n";
        exit_code = stop(1);
        return std::nullopt;
      }
      children.push_back(*child);
      addresses.push_back(absl::StrCat("127.0.0.1:", *port));
    }
    if (absl::Status ready = supervisor.WaitReady(children, absl::Seconds(flags.startup_timeout_s));
        !ready.ok()) {
      if (absl::IsCancelled(ready)) {
        exit_code = stop(0);
        return std::nullopt;
      }
      std::cerr << "tandem serve: " << kind << "s: " << ready.message() << "\n";
      exit_code = stop(1);
      return std::nullopt;
    }
    return addresses;
  };
  std::string speculative = flags.speculative;
  if (flags.drafters > 0) {
    auto addresses = start_helpers("drafter", flags.drafters, [&](int, int port) {
      return std::vector<std::string>{
          "drafter", "--drafter",          flags.drafter, "--model",          flags.model_dir,
          "--port",  std::to_string(port), "--device",    flags.decode_device};
    });
    if (!addresses.has_value()) return exit_code;
    speculative = absl::StrCat("remote:", absl::StrJoin(*addresses, ","));
  }
  // MLP shards (--mlp remote --mlp-shards N): N contiguous ranges of the model's layers.
  std::string mlp = flags.mlp;
  if (flags.mlp_shards > 0) {
    absl::StatusOr<ModelConfig> config = LoadModelConfig(flags.model_dir);
    if (!config.ok()) {
      std::cerr << "tandem serve: " << config.status().message() << "\n";
      return stop(1);
    }
    if (flags.mlp_shards > config->num_layers) {
      std::cerr << "tandem serve: --mlp-shards " << flags.mlp_shards << ": the model has only "
                << config->num_layers << " layers\n";
      return stop(2);
    }
    // Decode workers on a GPU get GPU shards on that GPU, reached over the GPU data plane.
    const bool gpu = absl::StartsWith(flags.decode_device, "cuda");
    const int layers = config->num_layers, n = flags.mlp_shards;
    auto addresses = start_helpers("mlp-shard", n, [&](int i, int port) {
      const int first = layers * i / n, end = layers * (i + 1) / n;
      return std::vector<std::string>{"mlp-shard",
                                      "--model",
                                      flags.model_dir,
                                      "--layers",
                                      absl::StrCat(first, ":", end),
                                      "--port",
                                      std::to_string(port),
                                      "--device",
                                      gpu ? flags.decode_device : std::string("cpu")};
    });
    if (!addresses.has_value()) return exit_code;
    mlp = absl::StrCat(gpu ? "cuda_ipc:" : "remote:", absl::StrJoin(*addresses, ","));
  }
  std::vector<Child*> prefill;
  std::vector<Child*> decode;
  std::vector<std::string> common = {"--model", flags.model_dir, "--kv-transfer",
                                     flags.kv_transfer};
  // Prefill workers get their ports chosen here, so the decode workers can be told at start
  // which prefill workers they may dial (--allowed-prefill-worker): a request naming any other
  // address is refused. (A port taken between the pick and the worker's bind fails its start.)
  // Decode workers' ports too: a worker restarted after a crash comes back on its port, where
  // the router (and, for prefill workers, the decode workers) still look for it.
  std::vector<int> ports;
  for (int i = 0; i < num_prefill + flags.decode_workers; ++i) {
    absl::StatusOr<int> port = FreeLoopbackPort();
    if (!port.ok()) {
      std::cerr << "tandem serve: a port for worker " << i << ": " << port.status().message()
                << "\n";
      return stop(1);
    }
    ports.push_back(*port);
  }
  const std::vector<int> prefill_ports(ports.begin(), ports.begin() + num_prefill);
  std::vector<std::string> allowed_prefill;
  for (int port : prefill_ports) allowed_prefill.push_back(absl::StrCat("127.0.0.1:", port));
  if (flags.block_size > 0) {
    common.insert(common.end(), {"--block-size", std::to_string(flags.block_size)});
  }
  if (flags.kv_cache_mib > 0) {
    common.insert(common.end(), {"--kv-cache-mib", std::to_string(flags.kv_cache_mib)});
  }
  if (!flags.cuda_tuning.empty()) {
    common.insert(common.end(), {"--cuda-tuning", flags.cuda_tuning});
  }
  for (int i = 0; i < num_prefill + flags.decode_workers; ++i) {
    const bool is_prefill = i < num_prefill;
    std::vector<std::string> args = {is_prefill ? "prefill" : "decode"};
    args.insert(args.end(), common.begin(), common.end());
    args.insert(args.end(), {"--device", is_prefill ? flags.prefill_device : flags.decode_device});
    const int batched =
        is_prefill ? flags.prefill_max_num_batched_tokens : flags.max_num_batched_tokens;
    if (batched > 0) args.insert(args.end(), {"--max-num-batched-tokens", std::to_string(batched)});
    if (flags.long_prefill_token_threshold > 0) {
      args.insert(args.end(), {"--long-prefill-token-threshold",
                               std::to_string(flags.long_prefill_token_threshold)});
    }
    args.insert(args.end(), {"--port", std::to_string(ports[i])});
    if (is_prefill) args.insert(args.end(), {"--kv-streaming", flags.kv_streaming});
    if (!is_prefill) args.insert(args.end(), {"--kv-verify", flags.kv_verify});
    if (!is_prefill && !speculative.empty()) {
      args.insert(args.end(), {"--speculative", speculative, "--num-speculative-tokens",
                               std::to_string(flags.num_speculative_tokens)});
    }
    // Decode (and aggregated) workers only: prefill keeps its MLP local (docs/mlp.md).
    if (!is_prefill && mlp != "local") {
      args.insert(args.end(), {"--mlp", mlp, "--mlp-fallback", flags.mlp_fallback,
                               "--mlp-micro-batches", std::to_string(flags.mlp_micro_batches),
                               "--mlp-call-timeout-ms", std::to_string(flags.mlp_call_timeout_ms)});
      if (absl::StartsWith(mlp, "remote:")) {
        args.insert(args.end(), {"--mlp-data-plane", flags.mlp_data_plane});
      }
    }
    if (!is_prefill) {
      args.insert(args.end(), {"--two-phase-admission", flags.two_phase_admission});
    }
    if (is_prefill && flags.admission_window_tokens >= 0) {
      args.insert(args.end(),
                  {"--admission-window-tokens", std::to_string(flags.admission_window_tokens)});
    }
    if (!is_prefill && !allowed_prefill.empty()) {
      args.insert(args.end(), {"--allowed-prefill-worker", absl::StrJoin(allowed_prefill, ",")});
    }
    // Every worker's own /metrics (KV transfer bytes, fallbacks, streaming) on a free port; each
    // prints "metrics on http://HOST:PORT/metrics" at start.
    args.insert(args.end(), {"--metrics-port", "-1"});
    args.insert(args.end(), service_args.begin(), service_args.end());
    const std::string name =
        is_prefill ? absl::StrCat("prefill-", i) : absl::StrCat("decode-", i - num_prefill);
    auto child = supervisor.Start(name, args);
    if (!child.ok()) {
      std::cerr << "tandem serve: starting " << name << ": " << child.status().message() << "\n";
      return stop(1);
    }
    (is_prefill ? prefill : decode).push_back(*child);
  }
  std::vector<Child*> workers = prefill;
  workers.insert(workers.end(), decode.begin(), decode.end());
  const absl::Duration startup = absl::Seconds(flags.startup_timeout_s);
  if (absl::Status ready = supervisor.WaitReady(workers, startup); !ready.ok()) {
    if (absl::IsCancelled(ready)) return stop(0);
    std::cerr << "tandem serve: workers: " << ready.message() << "\n";
    // A worker's usage error (exit 2, e.g. --device cuda without a usable GPU) is ours too.
    for (Child* worker : workers) {
      if (worker->reaped && WIFEXITED(worker->wait_status) &&
          WEXITSTATUS(worker->wait_status) == 2) {
        return stop(2);
      }
    }
    return stop(1);
  }

  const auto addresses = [](const std::vector<Child*>& children) {
    std::vector<std::string> out;
    for (Child* child : children) {
      absl::MutexLock lock(&child->mu);
      out.push_back(absl::StrCat("127.0.0.1:", PortOf(child->ready_address)));
    }
    return absl::StrJoin(out, ",");
  };
  std::vector<std::string> router_args = {"router",
                                          "--model",
                                          flags.model_dir,
                                          "--host",
                                          flags.host,
                                          "--port",
                                          std::to_string(flags.port),
                                          "--decode-workers",
                                          addresses(decode),
                                          "--routing",
                                          flags.routing};
  router_args.insert(router_args.end(),
                     {"--local-prefill-threshold", std::to_string(flags.local_prefill_threshold)});
  if (flags.kv_aware_request_cost >= 0) {
    router_args.insert(router_args.end(),
                       {"--kv-aware-request-cost", absl::StrCat(flags.kv_aware_request_cost)});
  }
  if (flags.kv_aware_replicate_weight >= 0) {
    router_args.insert(router_args.end(), {"--kv-aware-replicate-weight",
                                           absl::StrCat(flags.kv_aware_replicate_weight)});
  }
  if (!prefill.empty()) {
    router_args.insert(router_args.end(), {"--prefill-workers", addresses(prefill)});
  }
  router_args.insert(router_args.end(), service_args.begin(), service_args.end());
  if (flags.request_timeout_s > 0) {
    router_args.insert(router_args.end(),
                       {"--request-timeout-s", absl::StrCat(flags.request_timeout_s)});
  }
  const std::vector<std::string> frontend_args = FrontendModelArgs(flags.frontend);
  router_args.insert(router_args.end(), frontend_args.begin(), frontend_args.end());
  for (const std::string& host : flags.access.allowed_hosts) {
    router_args.insert(router_args.end(), {"--allowed-host", host});
  }
  for (const std::string& origin : flags.access.cors_origins) {
    router_args.insert(router_args.end(), {"--cors-origin", origin});
  }
  if (!flags.access.api_key_file.empty()) {
    router_args.insert(router_args.end(), {"--api-key-file", flags.access.api_key_file});
  }
  // --api-key values reach the router through a file only this user can read (mkstemp: 0600),
  // never its command line; it is removed when serve exits.
  std::string key_file;
  absl::Cleanup remove_key_file = [&key_file] {
    if (!key_file.empty()) unlink(key_file.c_str());
  };
  if (!flags.access.api_keys.empty()) {
    char path[] = "/tmp/tandem-api-keys-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) {
      std::cerr << "tandem serve: a file for the API keys: " << std::strerror(errno) << "\n";
      return stop(1);
    }
    key_file = path;
    const std::string keys = absl::StrCat(absl::StrJoin(flags.access.api_keys, "\n"), "\n");
    const bool written = write(fd, keys.data(), keys.size()) == static_cast<ssize_t>(keys.size());
    close(fd);
    if (!written) {
      unlink(key_file.c_str());
      std::cerr << "tandem serve: writing the API key file failed\n";
      return stop(1);
    }
    router_args.insert(router_args.end(), {"--api-key-file", key_file});
  }
  auto router = supervisor.Start("router", router_args);
  if (!router.ok()) {
    std::cerr << "tandem serve: starting the router: " << router.status().message() << "\n";
    return stop(1);
  }
  absl::Status router_ready = supervisor.WaitReady({*router}, startup);
  // The token and key files stay (0600, in a 0700 directory / mkstemp) while serve runs: a
  // child restarted after a crash reads them again. Both are removed on every exit.
  if (!router_ready.ok()) {
    if (absl::IsCancelled(router_ready)) return stop(0);
    std::cerr << "tandem serve: router: " << router_ready.message() << "\n";
    return stop(1);
  }
  std::string port;
  {
    absl::MutexLock lock(&(*router)->mu);
    port = PortOf((*router)->ready_address);
  }
  const std::string host =
      flags.host == "0.0.0.0" || flags.host == "127.0.0.1" ? "localhost" : flags.host;
  WriteLine(stdout, absl::StrCat("Tandem is serving ", flags.model_dir, " at http://", host, ":",
                                 port, "/v1 (Ctrl-C to stop)\n"));

  // The router keeps its port when restarted, even one it picked itself (--port 0).
  std::vector<std::string>& restart_args = (*router)->args;
  for (size_t i = 1; i < restart_args.size(); ++i) {
    if (restart_args[i - 1] == "--port") restart_args[i] = port;
  }

  // Supervision: a child that dies is started again after a backoff (1 s, doubling up to 30 s;
  // reset once it has run a minute) while the others keep serving: the router routes around a
  // worker that is down and takes it back once it is healthy. More than --max-restarts
  // consecutive crashes of one child stop everything (exit 1).
  struct Pending {
    Child* child;
    absl::Time at;
  };
  std::vector<Pending> pending;
  absl::flat_hash_map<std::string, int> crashes;  // consecutive, by child name
  while (true) {
    if (supervisor.WaitForSignal(absl::Milliseconds(100))) {
      Say(absl::StrCat("signal ", supervisor.signal(), ": stopping"));
      return stop(0);
    }
    while (Child* dead = supervisor.FindExited()) {
      int& n = crashes[dead->name];
      if (absl::Now() - dead->started >= absl::Minutes(1)) n = 0;
      ++n;
      if (n > flags.max_restarts) {
        Say(absl::StrCat(
            dead->name, " ", DescribeExit(dead->wait_status), " unexpectedly",
            flags.max_restarts > 0 ? absl::StrCat(" (", n, " times in a row)") : std::string(),
            "; stopping the rest"));
        return stop(1);
      }
      const absl::Duration backoff =
          std::min(absl::Seconds(30), absl::Seconds(1) * (int64_t{1} << std::min(n - 1, 5)));
      Say(absl::StrCat(dead->name, " ", DescribeExit(dead->wait_status),
                       " unexpectedly; restarting it in ", absl::FormatDuration(backoff),
                       " (restart ", n, " of at most ", flags.max_restarts, " in a row)"));
      pending.push_back({dead, absl::Now() + backoff});
    }
    for (auto it = pending.begin(); it != pending.end();) {
      if (absl::Now() < it->at) {
        ++it;
        continue;
      }
      const std::string name = it->child->name;
      absl::StatusOr<Child*> restarted = supervisor.Restart(it->child);
      it = pending.erase(it);
      if (!restarted.ok()) {
        Say(absl::StrCat("restarting ", name, ": ", restarted.status().message(),
                         "; stopping the rest"));
        return stop(1);
      }
      Say(absl::StrCat(name, " restarted (pid ", (*restarted)->pid, ")"));
    }
  }
}

}  // namespace

void AddServeCommand(CLI::App& app, int* exit_code) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Run router + prefill + decode workers as local processes (Ctrl-C stops all)");
  cmd->add_option("--model", flags->model_dir,
                  "Model directory (default: models/target, else a generated tiny model)")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--prefill-workers", flags->prefill_workers, "Prefill workers (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--decode-workers", flags->decode_workers, "Decode workers (default 1)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--port", flags->port, "Router HTTP port (default 8000)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--host", flags->host, "Router bind address (default 127.0.0.1)");
  cmd->add_flag("--aggregated", flags->aggregated,
                "No prefill workers: decode workers prefill locally (the baseline)");
  cmd->add_option(
         "--kv-transfer", flags->kv_transfer,
         "KV transfer backend: auto (default: cuda_ipc, nccl, cma, then ucx on GPUs; cma, then "
         "ucx on CPUs; each worker pair's handshake picks), cuda_ipc (GPU to GPU on this host; "
         "needs --device cuda), nccl (GPU to GPU across hosts; needs libnccl.so.2), cma (host "
         "memory on this host, process_vm_writev), ucx, or loopback (one process only: across "
         "processes decode workers then recompute prompts locally)")
      ->check(CLI::IsMember({"auto", "ucx", "cma", "cuda_ipc", "nccl", "loopback"}));
  cmd->add_option("--device", flags->device,
                  "Worker device: cpu (default), cuda or cuda:N (every worker on that GPU)");
  cmd->add_option("--prefill-device", flags->prefill_device,
                  "Device of the prefill workers (default: --device)");
  cmd->add_option("--decode-device", flags->decode_device,
                  "Device of the decode workers (default: --device); pools may differ, e.g. "
                  "--prefill-device cuda --decode-device cpu");
  cmd->add_option("--block-size", flags->block_size,
                  "Tokens per KV block of every worker (default: theirs, 16)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--kv-cache-mib", flags->kv_cache_mib,
                  "KV cache per worker in MiB (default: the workers' 256); with --device cuda "
                  "as much again of pinned host memory")
      ->check(CLI::PositiveNumber);
  AddCudaTuningFlag(cmd, &flags->cuda_tuning);
  cmd->add_option("--max-num-batched-tokens", flags->max_num_batched_tokens,
                  "Tokens per step of decode (and aggregated) workers (default: theirs, 512)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-max-num-batched-tokens", flags->prefill_max_num_batched_tokens,
                  "Tokens per step of prefill workers (default: theirs, 8192)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--long-prefill-token-threshold", flags->long_prefill_token_threshold,
                  "Fairness on every worker: a prompt's first share of a step while others wait "
                  "(0: no cap, the default)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-streaming", flags->kv_streaming,
                  "on (default): prefill workers write each layer's KV as soon as it is computed "
                  "(device backends); off: after the whole prompt")
      ->check(CLI::IsMember({"on", "off"}));
  AddAccessFlags(cmd, &flags->access);
  AddServiceAuthFlags(cmd, &flags->service_auth);
  AddLogFormatFlag(cmd, &flags->log_format);
  cmd->add_option("--admission-window-tokens", flags->admission_window_tokens,
                  "Prefill workers' admission window in prompt tokens (two-phase reservation; "
                  "default: theirs, 16384; 0: admit everyone at once)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--two-phase-admission", flags->two_phase_admission,
                  "on (default): decode workers reserve KV blocks once the prefill worker admits "
                  "the prompt; off: at once")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--kv-verify", flags->kv_verify,
                  "on: decode workers check each prompt's KV that landed in host memory against "
                  "the prefill worker's checksum (a mismatch recomputes it); off (default)")
      ->check(CLI::IsMember({"on", "off"}));
  cmd->add_option("--speculative", flags->speculative,
                  "Speculative decoding on decode (and aggregated) workers with this drafter: "
                  "ngram, draft:DIR, remote:ADDR,... or remote (the --drafters this serve "
                  "starts); docs/speculative.md. Default: off");
  cmd->add_option("--mlp", flags->mlp,
                  "Where decode (and aggregated) workers run their MLP: local (default), cpu, "
                  "remote:ADDR,... or remote (the --mlp-shards this serve starts); prefill "
                  "workers keep it local. docs/mlp.md")
      ->capture_default_str();
  cmd->add_option("--mlp-shards", flags->mlp_shards,
                  "With --mlp remote: `tandem mlp-shard` services to start, each serving a "
                  "contiguous range of the layers, shared by every decode worker (on the decode "
                  "workers' GPU, over cuda_ipc, when they run on one)")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--mlp-fallback", flags->mlp_fallback,
                  "With --mlp remote: none, or cpu (workers keep the MLP weights and compute a "
                  "layer no shard answers)")
      ->check(CLI::IsMember({"none", "cpu"}))
      ->capture_default_str();
  cmd->add_option("--mlp-call-timeout-ms", flags->mlp_call_timeout_ms,
                  "With --mlp remote: how long one layer's call to a shard may take before the "
                  "worker fails over (docs/tuning.md)")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->add_option("--mlp-data-plane", flags->mlp_data_plane,
                  "With --mlp remote on the CPU: how a call's rows reach the shards: grpc (in "
                  "the call's messages), cma or ucx (the host data plane). docs/mlp.md")
      ->check(CLI::IsMember({"grpc", "cma", "ucx"}))
      ->capture_default_str();
  cmd->add_option("--mlp-micro-batches", flags->mlp_micro_batches,
                  "With --mlp remote: micro-batches a decode step runs in ping-pong; 0 chooses "
                  "per batch size from measured step times, 1 turns it off")
      ->check(CLI::Range(0, 16))
      ->capture_default_str();
  cmd->add_option("--drafters", flags->drafters,
                  "With --speculative remote: `tandem drafter` services to start (each running "
                  "--drafter) and wire to the decode workers")
      ->check(CLI::Range(0, 64));
  cmd->add_option("--drafter", flags->drafter,
                  "What the --drafters run: ngram (default) or draft:DIR")
      ->capture_default_str();
  cmd->add_option("--num-speculative-tokens", flags->num_speculative_tokens,
                  "With --speculative: the most drafts per sequence and step (default 4)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--routing", flags->routing,
                  "kv-aware (default), least-loaded or round-robin (docs/routing.md)")
      ->check(CLI::IsMember({"least-loaded", "round-robin", "kv-aware"}));
  cmd->add_option("--local-prefill-threshold", flags->local_prefill_threshold,
                  "Prompts whose uncached part is shorter than this many tokens prefill on the "
                  "decode worker (default 0: never)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-aware-request-cost", flags->kv_aware_request_cost,
                  "kv-aware routing: what one request already on a worker costs, in prompt "
                  "tokens (default 64)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--kv-aware-replicate-weight", flags->kv_aware_replicate_weight,
                  "kv-aware routing: weight of missed prefix tokens on a worker with empty room "
                  "for them, 0..1 (default 0.25)")
      ->check(CLI::Range(0.0, 1.0));
  AddFrontendModelFlags(cmd, &flags->frontend);
  cmd->add_option("--startup-timeout-s", flags->startup_timeout_s,
                  "Seconds each stage may take to become ready (default 300)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--request-timeout-s", flags->request_timeout_s,
                  "Deadline of each request, from arrival to its last token: past it the client "
                  "gets an error (504 or a final error event) and its work stops (default: none)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--drain-seconds", flags->drain_seconds,
                  "On SIGINT/SIGTERM: the router refuses new requests and gives running ones this "
                  "long to finish, then ends them with an error event (default 5)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-restarts", flags->max_restarts,
                  "Consecutive crashes of one child that serve restarts (with a backoff from 1 s "
                  "to 30 s) before it stops everything; 0: stop at the first (default 5)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--stop-timeout-s", flags->stop_timeout_s,
                  "Seconds children get to stop after SIGTERM before SIGKILL (default 10)")
      ->check(CLI::PositiveNumber);
  cmd->callback([flags, exit_code] { *exit_code = RunServe(*flags); });
}

}  // namespace tandem::cli
