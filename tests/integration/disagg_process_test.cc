// The real thing as separate processes: `tandem prefill` and `tandem decode` children of this
// test, KV over UCX, driven through Decode.Generate. Greedy tokens must equal `tandem generate`
// (a third process) and a local Engine run. Every wait has a deadline; children are killed on
// any failure and must exit 0 on SIGTERM otherwise.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/auth/service_identity.h"
#include "runtime/model/synth.h"
#include "tandem/v1/decode.grpc.pb.h"

extern char** environ;

namespace tandem {
namespace {

// A child process with its stdout on a pipe; killed (SIGKILL) on destruction if still running.
class Child {
 public:
  static std::unique_ptr<Child> Spawn(const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) return nullptr;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&actions, fds[0]);
    posix_spawn_file_actions_addclose(&actions, fds[1]);
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      return nullptr;
    }
    auto child = std::unique_ptr<Child>(new Child());
    child->pid_ = pid;
    child->out_ = fds[0];
    return child;
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }

  // Reads stdout until a full line arrives or the deadline passes.
  std::optional<std::string> ReadLine(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (size_t nl = buffer_.find('\n'); nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return std::nullopt;
      pollfd p{out_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) continue;
      char chunk[4096];
      const ssize_t n = read(out_, chunk, sizeof(chunk));
      if (n <= 0) return std::nullopt;  // EOF: the child exited
      buffer_.append(chunk, n);
    }
  }
  // Reads all of stdout until EOF or the deadline.
  std::string ReadAll(absl::Duration timeout) {
    std::string all;
    while (auto line = ReadLine(timeout)) all += *line + "\n";
    all += buffer_;
    return all;
  }

  // SIGTERM, then waits up to `timeout` for the exit status (nullopt: still running).
  std::optional<int> Terminate(absl::Duration timeout) {
    kill(pid_, SIGTERM);
    return Wait(timeout);
  }
  std::optional<int> Wait(absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (absl::Now() < deadline) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return std::nullopt;
  }

 private:
  Child() = default;
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buffer_;
};

// A port that was free a moment ago (the kernel's pick for port 0).
int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// GET /metrics on 127.0.0.1:port (HTTP/1.0, read to EOF, 10 s at most); "" on failure.
std::string FetchMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  std::string body;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char chunk[4096];
      ssize_t n;
      while ((n = read(fd, chunk, sizeof(chunk))) > 0) body.append(chunk, n);
    }
  }
  close(fd);
  return body;
}

// The value of an unlabelled sample `name` in a Prometheus text body (-1 when absent).
double MetricValue(const std::string& text, const std::string& name) {
  size_t pos = 0;
  while ((pos = text.find(name + " ", pos)) != std::string::npos) {
    if (pos == 0 || text[pos - 1] == '\n') return std::stod(text.substr(pos + name.size() + 1));
    pos += name.size();
  }
  return -1;
}

// "tandem <role>: serving on HOST:PORT" -> "HOST:PORT".
std::optional<std::string> ServingAddress(Child& child, const std::string& role) {
  const std::string prefix = absl::StrCat("tandem ", role, ": serving on ");
  auto line = child.ReadLine(absl::Seconds(60));
  if (!line.has_value() || line->rfind(prefix, 0) != 0) return std::nullopt;
  return line->substr(prefix.size());
}

TEST(DisaggProcessTest, PrefillAndDecodeProcessesOverUcxMatchGenerate) {
  const std::string tandem = std::string(TANDEM_BUILD_DIR) + "/tandem";
  ASSERT_TRUE(std::filesystem::exists(tandem)) << tandem;
  const std::string dir = absl::StrCat(::testing::TempDir(), "/disagg_process_tiny_", getpid());
  SynthOptions synth;
  synth.like = "tiny";
  synth.out_dir = dir;
  synth.seed = 3;
  synth.num_threads = 2;
  ASSERT_TRUE(SynthesizeModel(synth, nullptr).ok());

  // The service token both workers require, in a file only this user can read.
  const std::string token = "process-test-token-0123456789abcdef";
  const std::string token_file = dir + "/service-token";
  {
    std::ofstream(token_file) << token << "\n";
    ASSERT_EQ(chmod(token_file.c_str(), 0600), 0);
  }
  const std::vector<std::string> common = {
      "--model",      dir,  "--port",       "0",  "--kv-transfer",        "ucx",
      "--block-size", "16", "--num-blocks", "64", "--service-token-file", token_file};
  const int p_metrics = FreePort();
  const int d_metrics = FreePort();
  ASSERT_TRUE(p_metrics > 0 && d_metrics > 0 && p_metrics != d_metrics);
  std::vector<std::string> p_args = {tandem, "prefill", "--metrics-port",
                                     std::to_string(p_metrics)};
  p_args.insert(p_args.end(), common.begin(), common.end());
  std::vector<std::string> d_args = {tandem, "decode", "--metrics-port", std::to_string(d_metrics)};
  d_args.insert(d_args.end(), common.begin(), common.end());
  auto prefill = Child::Spawn(p_args);
  auto decode = Child::Spawn(d_args);
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  const std::optional<std::string> p_address = ServingAddress(*prefill, "prefill");
  const std::optional<std::string> d_address = ServingAddress(*decode, "decode");
  ASSERT_TRUE(p_address.has_value()) << "no readiness line from tandem prefill";
  ASSERT_TRUE(d_address.has_value()) << "no readiness line from tandem decode";

  const std::vector<int32_t> prompt = {17,  42, 99, 5, 123, 200, 7,  64,  31, 88,
                                       150, 9,  77, 3, 18,  240, 36, 101, 55, 90};
  constexpr int kMaxTokens = 12;

  // Through the two worker processes.
  auto identity = auth::ServiceIdentity::FromTokens({token});
  ASSERT_TRUE(identity.ok());
  {
    // Without the token the worker process refuses the call and runs nothing.
    auto anonymous =
        v1::Decode::NewStub(auth::ServiceIdentity::Unauthenticated()->Dial(*d_address));
    v1::GenerateRequest request;
    request.set_request_id("anonymous");
    request.add_prompt_token_ids(17);
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    auto reader = anonymous->Generate(&context, request);
    v1::GenerateResponse message;
    EXPECT_FALSE(reader->Read(&message));
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  auto stub = v1::Decode::NewStub((*identity)->Dial(*d_address));
  v1::GenerateRequest request;
  request.set_request_id("process-test");
  for (int32_t t : prompt) request.add_prompt_token_ids(t);
  request.mutable_sampling()->set_temperature(0.0f);
  request.mutable_sampling()->set_max_tokens(kMaxTokens);
  request.mutable_sampling()->set_ignore_eos(true);
  request.mutable_sampling()->set_logprobs(-1);
  request.set_prefill_worker(*p_address);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse message;
  std::vector<int32_t> got;
  bool remote = false;
  bool first = true;
  std::string finish;
  while (reader->Read(&message)) {
    if (first) remote = message.prefilled_remotely();
    first = false;
    got.insert(got.end(), message.token_ids().begin(), message.token_ids().end());
    if (!message.finish_reason().empty()) finish = message.finish_reason();
  }
  const grpc::Status status = reader->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(remote) << "the decode worker fell back to local prefill";
  EXPECT_EQ(finish, "length");
  ASSERT_EQ(got.size(), static_cast<size_t>(kMaxTokens));

  // The KV really moved: P's transfer bytes equal the prompt's KV size, computed from config.json
  // (ceil(len / 16) blocks x K and V x layers x 16 x kv_heads x head_dim x 4 bytes). D holds no
  // blocks once the request is done.
  std::ifstream config_file(dir + "/config.json");
  const nlohmann::json config = nlohmann::json::parse(config_file);
  const int64_t blocks = (static_cast<int64_t>(prompt.size()) + 15) / 16;
  const int64_t kv_bytes = blocks * 2 * config["num_hidden_layers"].get<int64_t>() * 16 *
                           config["num_key_value_heads"].get<int64_t>() *
                           config["head_dim"].get<int64_t>() * 4;
  EXPECT_EQ(MetricValue(FetchMetrics(p_metrics), "tandem_kv_transfer_bytes_total{backend=\"ucx\"}"),
            static_cast<double>(kv_bytes));
  const absl::Time drained_by = absl::Now() + absl::Seconds(10);
  double used = -1;
  while (absl::Now() < drained_by) {
    const std::string text = FetchMetrics(d_metrics);
    used = MetricValue(text, "tandem_kv_blocks_used");
    if (used == 0 && MetricValue(text, "tandem_requests_running") == 0) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_EQ(used, 0);

  // `tandem generate` in a third process.
  auto generate =
      Child::Spawn({tandem, "generate", "--model", dir, "--prompt-ids", absl::StrJoin(prompt, ","),
                    "--max-tokens", std::to_string(kMaxTokens), "--ignore-eos", "--json"});
  ASSERT_NE(generate, nullptr);
  const std::string json_text = generate->ReadAll(absl::Seconds(60));
  ASSERT_EQ(generate->Wait(absl::Seconds(30)), std::optional<int>(0));
  const nlohmann::json json = nlohmann::json::parse(json_text, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << json_text;
  EXPECT_EQ(got, json["token_ids"].get<std::vector<int32_t>>());

  // Both workers stop cleanly on SIGTERM.
  EXPECT_EQ(decode->Terminate(absl::Seconds(15)), std::optional<int>(0));
  EXPECT_EQ(prefill->Terminate(absl::Seconds(15)), std::optional<int>(0));
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

}  // namespace
}  // namespace tandem
