// `tandem serve` as a process: it starts router + prefill + decode children, serves a completion
// over HTTP, and leaves no process behind on SIGINT, on SIGKILL (PR_SET_PDEATHSIG), or when a
// child dies.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/auth/service_identity.h"

namespace {

namespace fs = std::filesystem;

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

// A TCP connection to 127.0.0.1:port with a 60 s read timeout; -1 on failure.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// One HTTP/1.1 request with Connection: close; the whole response ("" on connect failure).
// `on_read`, when given, sees the response so far after every read.
std::string HttpPost(int port, const std::string& path, const std::string& body,
                     const std::string& extra_headers = "", const std::string& host = "127.0.0.1",
                     const std::function<void(const std::string&)>& on_read = nullptr) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) {
    return "";
  }
  const std::string request = absl::StrCat(
      "POST ", path, " HTTP/1.1\r\nHost: ", host, "\r\nContent-Type: application/json\r\n",
      extra_headers, "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body);
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = write(fd, request.data() + sent, request.size() - sent);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    response.append(buf, static_cast<size_t>(n));
    if (on_read) on_read(response);
  }
  close(fd);
  return response;
}

// Direct children of `parent`, from /proc/*/stat.
std::vector<pid_t> ChildrenOf(pid_t parent) {
  std::vector<pid_t> out;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    pid_t pid;
    if (!absl::SimpleAtoi(entry.path().filename().string(), &pid)) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close_paren = text.rfind(')');
    if (close_paren == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(text.substr(close_paren + 2), ' ');
    pid_t ppid;
    if (fields.size() > 1 && absl::SimpleAtoi(fields[1], &ppid) && ppid == parent) {
      out.push_back(pid);
    }
  }
  return out;
}

// Gone, or a zombie nobody has reaped yet (it runs nothing and holds no port).
bool IsDead(pid_t pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  if (!stat) return true;
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close_paren = text.rfind(')');
  return close_paren == std::string::npos || text.size() < close_paren + 3 ||
         text[close_paren + 2] == 'Z' || text[close_paren + 2] == 'X';
}

bool WaitFor(const std::function<bool()>& done, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return done();
}

// "HOST:PORT" from serve's "[NAME] tandem ROLE: serving on HOST:PORT" line ("" when absent).
std::string ServingAddress(const std::string& output, const std::string& name) {
  const std::string role = name.substr(0, name.find('-'));
  const std::string marker = absl::StrCat("[", name, "] tandem ", role, ": serving on ");
  const size_t at = output.find(marker);
  if (at == std::string::npos) return "";
  const size_t begin = at + marker.size();
  return output.substr(begin, output.find('\n', begin) - begin);
}

// The body of GET `path` on 127.0.0.1:`port` ("" on connect failure or a non-200 answer).
std::string HttpGetBody(int port, const std::string& path) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return "";
  const std::string request =
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buf[4096];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (!absl::StartsWith(response, "HTTP/1.1 200") || body == std::string::npos) return "";
  return response.substr(body + 4);
}

// The running batch of the decode worker `pid` of a `tandem serve` whose output is `output`: its
// `--port` finds its name in the "serving on" lines, the name its /metrics port, and that its
// tandem_requests_running. -1 when any of these is missing.
int RunningSequences(pid_t pid, const std::string& output) {
  std::ifstream cmdline(absl::StrCat("/proc/", pid, "/cmdline"));
  std::vector<std::string> args;
  for (std::string arg; std::getline(cmdline, arg, '\0');) args.push_back(arg);
  const auto port = std::find(args.begin(), args.end(), "--port");
  if (port == args.end() || port + 1 == args.end()) return -1;
  for (int k = 0; k < 16; ++k) {
    const std::string name = absl::StrCat("decode-", k);
    if (!absl::EndsWith(ServingAddress(output, name), absl::StrCat(":", *(port + 1)))) continue;
    const std::string marker =
        absl::StrCat("[", name, "] tandem decode: metrics on http://127.0.0.1:");
    const size_t at = output.find(marker);
    int metrics_port;
    if (at == std::string::npos ||
        !absl::SimpleAtoi(output.substr(at + marker.size(),
                                        output.find('/', at + marker.size()) - at - marker.size()),
                          &metrics_port)) {
      return -1;
    }
    for (absl::string_view line : absl::StrSplit(HttpGetBody(metrics_port, "/metrics"), '\n')) {
      double running;
      if (absl::ConsumePrefix(&line, "tandem_requests_running ") &&
          absl::SimpleAtod(line, &running)) {
        return static_cast<int>(running);
      }
    }
    return -1;
  }
  return -1;
}

// The value of the unlabelled metric `name` on the /metrics of serve's child `child` (from its
// "[CHILD] tandem ROLE: metrics on http://127.0.0.1:PORT" line); -1 when missing.
double ChildMetric(const std::string& output, const std::string& child, const std::string& name) {
  const std::string role = child.substr(0, child.find('-'));
  const std::string marker =
      absl::StrCat("[", child, "] tandem ", role, ": metrics on http://127.0.0.1:");
  const size_t at = output.find(marker);
  int port;
  if (at == std::string::npos ||
      !absl::SimpleAtoi(output.substr(at + marker.size(),
                                      output.find('/', at + marker.size()) - at - marker.size()),
                        &port)) {
    return -1;
  }
  for (absl::string_view line : absl::StrSplit(HttpGetBody(port, "/metrics"), '\n')) {
    double value;
    if (absl::ConsumePrefix(&line, name + " ") && absl::SimpleAtod(line, &value)) return value;
  }
  return -1;
}

// grpc.health.v1.Health/Check on `address` with no service credential.
grpc::Status AnonymousHealthCheck(const std::string& address) {
  auto health = grpc::health::v1::Health::NewStub(
      tandem::auth::ServiceIdentity::Unauthenticated()->Dial(address));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
  grpc::health::v1::HealthCheckRequest check;
  grpc::health::v1::HealthCheckResponse answer;
  return health->Check(&context, check, &answer);
}

// A `tandem serve` child with its output captured.
class ServeProcess {
 public:
  ServeProcess(const std::vector<std::string>& args, const std::string& cache_dir) {
    const std::string tandem = absl::StrCat(TANDEM_BUILD_DIR, "/tandem");
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    std::vector<std::string> argv_storage = {tandem, "serve"};
    argv_storage.insert(argv_storage.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string env = absl::StrCat("XDG_CACHE_HOME=", cache_dir);
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      putenv(const_cast<char*>(env.c_str()));
      // Away from the source tree, so the default model is the generated tiny one even when a
      // bundled models/target exists.
      if (chdir(cache_dir.c_str()) != 0) _exit(126);
      execv(tandem.c_str(), argv.data());
      _exit(127);
    }
    close(fds[1]);
    reader_ = std::thread([this, fd = fds[0]] {
      char buf[4096];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) {
        absl::MutexLock lock(&mu_);
        output_.append(buf, static_cast<size_t>(n));
      }
      close(fd);
    });
  }
  ~ServeProcess() {
    if (!exited_) {
      kill(pid_, SIGKILL);
      Wait(absl::Seconds(10));
    }
    if (reader_.joinable()) reader_.join();
  }

  pid_t pid() const { return pid_; }
  std::string output() {
    absl::MutexLock lock(&mu_);
    return output_;
  }
  bool WaitForOutput(const std::string& text, absl::Duration timeout) {
    return WaitFor(
        [&] {
          absl::MutexLock lock(&mu_);
          return output_.find(text) != std::string::npos;
        },
        timeout);
  }
  // The exit status, or -1 if it did not exit in time.
  int Wait(absl::Duration timeout) {
    WaitFor(
        [&] {
          if (exited_) return true;
          int status;
          if (waitpid(pid_, &status, WNOHANG) == pid_) {
            exited_ = true;
            status_ = status;
          }
          return exited_;
        },
        timeout);
    return exited_ ? status_ : -1;
  }

 private:
  pid_t pid_ = -1;
  bool exited_ = false;
  int status_ = 0;
  std::thread reader_;
  absl::Mutex mu_;
  std::string output_;
};

class ServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cache_dir_ = fs::temp_directory_path() / absl::StrCat("tandem-serve-test-", getpid());
    fs::create_directories(cache_dir_);
  }
  void TearDown() override { fs::remove_all(cache_dir_); }

  // Starts serve and waits for its URL line; the children it started.
  std::vector<pid_t> StartServing(ServeProcess& serve, int port, size_t expected_children = 3) {
    const bool ready = serve.WaitForOutput(absl::StrCat("Tandem is serving"), absl::Seconds(120));
    EXPECT_TRUE(ready) << serve.output();
    if (!ready) return {};
    EXPECT_NE(serve.output().find(absl::StrCat("http://localhost:", port, "/v1")),
              std::string::npos)
        << serve.output();
    std::vector<pid_t> children = ChildrenOf(serve.pid());
    EXPECT_EQ(children.size(), expected_children) << serve.output();
    return children;
  }

  fs::path cache_dir_;
};

TEST_F(ServeTest, ServesACompletionAndLeavesNoProcessAfterSigint) {
  const int port = FreePort();
  ServeProcess serve(
      {"--port", std::to_string(port), "--prefill-workers", "1", "--decode-workers", "1"},
      cache_dir_.string());
  const std::vector<pid_t> children = StartServing(serve, port);
  ASSERT_EQ(children.size(), 3u) << serve.output();
  // The default model was created under $XDG_CACHE_HOME/tandem.
  EXPECT_TRUE(fs::exists(cache_dir_ / "tandem" / "models" / "tiny" / "config.json"));
  for (const char* prefix : {"[router] ", "[prefill-0] ", "[decode-0] "}) {
    EXPECT_NE(serve.output().find(prefix), std::string::npos) << prefix;
  }

  const std::string response =
      HttpPost(port, "/v1/completions",
               R"({"model": "tiny", "prompt": "The quick brown fox jumps over the lazy dog", )"
               R"("max_tokens": 5, "temperature": 0, "ignore_eos": true})");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("\"completion_tokens\":5"), std::string::npos) << response;
  EXPECT_NE(response.find("\"finish_reason\":\"length\""), std::string::npos) << response;
  // The prompt's KV came from the prefill worker over UCX, not a local recompute.
  EXPECT_EQ(serve.output().find("prefilling locally"), std::string::npos) << serve.output();
  // The decode worker was told which prefill worker it may dial (and dialed it: no fallback).
  int told = 0;
  for (pid_t child : children) {
    std::ifstream cmdline(absl::StrCat("/proc/", child, "/cmdline"));
    const std::string text((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
    if (text.find("--allowed-prefill-worker") != std::string::npos) ++told;
  }
  EXPECT_EQ(told, 1) << "exactly the decode worker gets --allowed-prefill-worker";

  // Every child got the same fresh service token file, private to this user (a restarted child
  // reads it again; it goes when serve exits), and a worker refuses a gRPC call without it.
  std::vector<std::string> token_files;
  for (pid_t child : children) {
    std::ifstream cmdline(absl::StrCat("/proc/", child, "/cmdline"));
    std::vector<std::string> args;
    for (std::string arg; std::getline(cmdline, arg, '\0');) args.push_back(arg);
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--service-token-file") token_files.push_back(args[i + 1]);
    }
  }
  ASSERT_EQ(token_files.size(), 3u);
  for (const std::string& file : token_files) EXPECT_EQ(file, token_files[0]);
  EXPECT_EQ(fs::status(token_files[0]).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  EXPECT_EQ(fs::status(fs::path(token_files[0]).parent_path()).permissions() & fs::perms::all,
            fs::perms::owner_all);
  const std::string decode_address = ServingAddress(serve.output(), "decode-0");
  ASSERT_FALSE(decode_address.empty()) << serve.output();
  EXPECT_EQ(AnonymousHealthCheck(decode_address).error_code(), grpc::StatusCode::UNAUTHENTICATED)
      << decode_address;

  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  const int status = serve.Wait(absl::Seconds(40));
  ASSERT_NE(status, -1) << "serve did not exit after SIGINT\n" << serve.output();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << serve.output();
  for (pid_t child : children) EXPECT_TRUE(IsDead(child)) << "orphan " << child;
  EXPECT_NE(serve.output().find("[serve] signal 2: stopping"), std::string::npos);
  EXPECT_FALSE(fs::exists(fs::path(token_files[0]).parent_path())) << "the token outlived serve";
}

// --tls-ca/--tls-cert/--tls-key: every hop (router to workers, decode to prefill) runs over mTLS
// with certificates of one cluster CA (made here by the openssl CLI); the prompt is still
// prefilled remotely, and a plaintext client gets nothing from a worker.
TEST_F(ServeTest, MutualTlsBetweenEveryService) {
  const fs::path certs = cache_dir_ / "certs";
  fs::create_directories(certs);
  const std::string script = absl::StrCat(
      "set -e; cd '", certs.string(), "';",
      "openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 "
      "-subj /CN=tandem-test-ca 2>/dev/null;",
      "openssl req -newkey rsa:2048 -nodes -keyout svc.key -out svc.csr -subj /CN=tandem "
      "2>/dev/null;",
      "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > svc.ext;",
      "openssl x509 -req -in svc.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out svc.pem "
      "-days 2 -extfile svc.ext 2>/dev/null; chmod 600 svc.key");
  { std::ofstream(certs / "make.sh") << script; }
  ASSERT_EQ(std::system(absl::StrCat("bash '", (certs / "make.sh").string(), "'").c_str()), 0);
  const int port = FreePort();
  ServeProcess serve(
      {"--port", std::to_string(port), "--tls-ca", (certs / "ca.pem").string(), "--tls-cert",
       (certs / "svc.pem").string(), "--tls-key", (certs / "svc.key").string()},
      cache_dir_.string());
  const std::vector<pid_t> children = StartServing(serve, port);
  ASSERT_EQ(children.size(), 3u) << serve.output();
  EXPECT_NE(serve.output().find("service authentication: mtls"), std::string::npos)
      << serve.output();
  const std::string response =
      HttpPost(port, "/v1/completions",
               R"({"model": "tiny", "prompt": "The quick brown fox", "max_tokens": 4, )"
               R"("temperature": 0, "ignore_eos": true})");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("\"completion_tokens\":4"), std::string::npos) << response;
  EXPECT_EQ(serve.output().find("prefilling locally"), std::string::npos) << serve.output();

  const std::string prefill_address = ServingAddress(serve.output(), "prefill-0");
  ASSERT_FALSE(prefill_address.empty()) << serve.output();
  EXPECT_FALSE(AnonymousHealthCheck(prefill_address).ok());

  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  const int status = serve.Wait(absl::Seconds(40));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << serve.output();
}

// --log-format json: every line serve writes to stderr is one JSON object naming its process,
// and each request leaves one access line with its ids.
TEST_F(ServeTest, JsonLogsAndAnAccessLinePerRequest) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port), "--log-format", "json"}, cache_dir_.string());
  const std::vector<pid_t> children = StartServing(serve, port);
  ASSERT_EQ(children.size(), 3u) << serve.output();
  const std::string response = HttpPost(
      port, "/v1/completions",
      R"({"model": "tiny", "prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": true})",
      "X-Request-Id: client-abc-123\r\n");
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u) << response;
  EXPECT_NE(response.find("X-Request-Id: client-abc-123"), std::string::npos) << response;
  ASSERT_TRUE(serve.WaitForOutput("client_request_id=client-abc-123", absl::Seconds(20)))
      << serve.output();
  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  ASSERT_NE(serve.Wait(absl::Seconds(40)), -1);
  int json_lines = 0;
  bool access = false;
  for (absl::string_view line : absl::StrSplit(serve.output(), '\n', absl::SkipEmpty())) {
    // stdout's "Tandem is serving" line is for people; everything else is JSON.
    if (absl::StartsWith(line, "Tandem is serving")) continue;
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_object()) << line;
    EXPECT_TRUE(j.contains("process")) << line;
    ++json_lines;
    if (j.contains("msg") && j["msg"].get<std::string>().find(
                                 "access /v1/completions status=200") != std::string::npos) {
      access = true;
      EXPECT_EQ(j["process"], "router");
      EXPECT_NE(j["msg"].get<std::string>().find("completion_tokens=3"), std::string::npos);
    }
  }
  EXPECT_GT(json_lines, 5);
  EXPECT_TRUE(access) << serve.output();
}

// --api-key: the router answers 401 without the key and serves with it; the key reaches the
// router through a private file, never a command line. A Host that is not this server's is
// refused (DNS rebinding).
TEST_F(ServeTest, ApiKeyGuardsTheApiAndNeverShowsOnACommandLine) {
  const int port = FreePort();
  const std::string key = "tandem-test-key-7f3a";
  ServeProcess serve({"--port", std::to_string(port), "--aggregated", "--api-key", key},
                     cache_dir_.string());
  const std::vector<pid_t> children = StartServing(serve, port, 2);
  ASSERT_EQ(children.size(), 2u) << serve.output();
  for (pid_t child : children) {
    std::ifstream cmdline(absl::StrCat("/proc/", child, "/cmdline"));
    const std::string text((std::istreambuf_iterator<char>(cmdline)),
                           std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find(key), std::string::npos) << "the key is on a child's command line";
  }
  const std::string body = R"({"model": "tiny", "prompt": "Hello", "max_tokens": 2})";
  const std::string denied = HttpPost(port, "/v1/completions", body);
  EXPECT_EQ(denied.rfind("HTTP/1.1 401", 0), 0u) << denied;
  EXPECT_NE(denied.find("\"invalid_api_key\""), std::string::npos) << denied;
  const std::string wrong =
      HttpPost(port, "/v1/completions", body, "Authorization: Bearer not-the-key\r\n");
  EXPECT_EQ(wrong.rfind("HTTP/1.1 401", 0), 0u) << wrong;
  const std::string ok =
      HttpPost(port, "/v1/completions", body, absl::StrCat("Authorization: Bearer ", key, "\r\n"));
  EXPECT_EQ(ok.rfind("HTTP/1.1 200", 0), 0u) << ok;
  const std::string rebound =
      HttpPost(port, "/v1/completions", body, absl::StrCat("Authorization: Bearer ", key, "\r\n"),
               "attacker.example:8000");
  EXPECT_EQ(rebound.rfind("HTTP/1.1 421", 0), 0u) << rebound;
  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  EXPECT_NE(serve.Wait(absl::Seconds(40)), -1) << serve.output();
}

TEST_F(ServeTest, ChildrenDieWithAKilledServe) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port), "--kv-transfer", "ucx"}, cache_dir_.string());
  const std::vector<pid_t> children = StartServing(serve, port);
  ASSERT_EQ(children.size(), 3u) << serve.output();
  ASSERT_EQ(kill(serve.pid(), SIGKILL), 0);
  ASSERT_NE(serve.Wait(absl::Seconds(10)), -1);
  for (pid_t child : children) {
    EXPECT_TRUE(WaitFor([&] { return IsDead(child); }, absl::Seconds(10))) << "orphan " << child;
  }
}

// SIGTERM during a long stream: the router stops taking requests and, after --drain-seconds, ends
// the stream with an error event and [DONE]: the client is never left with a cut stream.
TEST_F(ServeTest, SigtermEndsRunningStreamsWithAFinalEvent) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port), "--drain-seconds", "0.5"},
                     cache_dir_.string());
  ASSERT_EQ(StartServing(serve, port).size(), 3u) << serve.output();
  absl::Notification streaming;
  std::string body;
  std::thread client([&] {
    const int fd = ConnectLoopback(port);
    if (fd < 0) {
      streaming.Notify();
      return;
    }
    const std::string json =
        R"({"model": "tiny", "prompt": "Once", "max_tokens": 4000, "temperature": 0, )"
        R"("ignore_eos": true, "stream": true})";
    const std::string request = absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Connection: close\r\nContent-Length: ",
        json.size(), "\r\n\r\n", json);
    (void)!write(fd, request.data(), request.size());
    char buf[4096];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0) {
      body.append(buf, static_cast<size_t>(n));
      if (!streaming.HasBeenNotified() && body.find("data: {") != std::string::npos) {
        streaming.Notify();
      }
    }
    if (!streaming.HasBeenNotified()) streaming.Notify();
    close(fd);
  });
  ASSERT_TRUE(streaming.WaitForNotificationWithTimeout(absl::Seconds(30)));
  ASSERT_EQ(kill(serve.pid(), SIGTERM), 0);
  client.join();
  const int status = serve.Wait(absl::Seconds(60));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << serve.output();
  // The stream's end: an error event naming the shutdown, then [DONE].
  const size_t error = body.find("\"error\"");
  ASSERT_NE(error, std::string::npos) << body.substr(body.size() > 2000 ? body.size() - 2000 : 0);
  EXPECT_NE(body.find("shutting down", error), std::string::npos);
  EXPECT_NE(body.find("data: [DONE]", error), std::string::npos);
}

// The text of a completion stream from its SSE events: "<error>" when it ended in an error,
// "<cut>" without a final [DONE], "<bad event>" for an event that is not JSON.
std::string StreamText(const std::string& response) {
  std::string text;
  for (absl::string_view line : absl::StrSplit(response, '\n')) {
    if (!absl::StartsWith(line, "data: {")) continue;
    const nlohmann::json j = nlohmann::json::parse(line.substr(6), nullptr, false);
    if (j.is_discarded()) return "<bad event>";
    if (j.contains("error")) return "<error>";
    for (const auto& choice : j["choices"]) {
      if (choice.contains("text") && choice["text"].is_string()) text += choice["text"];
    }
  }
  if (response.find("data: [DONE]") == std::string::npos) return "<cut>";
  return text;
}

// Streams `bodies` to /v1/completions at once and returns each stream's StreamText. Meanwhile
// `during(await_streaming)` runs on this thread, where await_streaming(k) waits (up to 60 s)
// until k streams have had their first event: faults can land mid-stream on any machine.
std::vector<std::string> StreamAll(
    int port, const std::vector<std::string>& bodies,
    const std::function<void(const std::function<void(int)>& await_streaming)>& during) {
  std::vector<std::string> texts(bodies.size());
  std::vector<std::thread> clients;
  absl::Mutex mu;
  int streaming = 0;
  for (size_t i = 0; i < bodies.size(); ++i) {
    clients.emplace_back([&, i] {
      bool counted = false;
      texts[i] = StreamText(HttpPost(
          port, "/v1/completions", bodies[i], "", "127.0.0.1", [&](const std::string& response) {
            if (counted || response.find("data: {") == std::string::npos) {
              return;
            }
            counted = true;
            absl::MutexLock lock(&mu);
            ++streaming;
          }));
    });
  }
  during([&](int k) {
    struct Reached {
      const int* streaming;
      int at;
      bool Check() const { return *streaming >= at; }
    } reached{&streaming, k};
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&reached, &Reached::Check), absl::Seconds(60));
  });
  for (std::thread& t : clients) t.join();  // bounded: every stream ends
  return texts;
}

// The one of `children` whose role (argv[1]) is `role`, or -1.
pid_t ChildWithRole(const std::vector<pid_t>& children, const std::string& role) {
  for (pid_t child : children) {
    std::ifstream cmdline(absl::StrCat("/proc/", child, "/cmdline"));
    std::vector<std::string> args;
    for (std::string arg; std::getline(cmdline, arg, '\0');) args.push_back(arg);
    if (args.size() > 1 && args[1] == role) return child;
  }
  return -1;
}

// Chaos, bounded: 2 prefill + 2 decode workers, 32 concurrent greedy streams; one decode worker
// and one prefill worker are killed with SIGKILL mid-run. Every stream completes with the text of
// an unfaulted run (streams on the dead decode worker migrate; prompts waiting on the dead
// prefill worker are prefilled on their decode worker), none hangs, and the restarted workers
// serve again.
TEST_F(ServeTest, ChaosKillingWorkersMidRunChangesNoText) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port), "--prefill-workers", "2", "--decode-workers",
                      "2", "--request-timeout-s", "120"},
                     cache_dir_.string());
  ASSERT_EQ(StartServing(serve, port, 5).size(), 5u) << serve.output();
  constexpr int kStreams = 32;
  // Even streams greedy; odd ones sampled with a seed, a penalty and a stop string that holds
  // text back whenever the output ends in a space (it never completes): a migration must carry
  // the seed position, the penalty's output tokens and the held-back text.
  const auto body = [](int i) {
    const std::string sampling =
        i % 2 == 0 ? R"("temperature": 0)"
                   : absl::StrCat(R"("temperature": 0.8, "seed": )", i,
                                  R"(, "presence_penalty": 0.5, "stop": [" xqzv"])");
    return absl::StrCat(R"({"model": "tiny", "prompt": "Stream )", i,
                        R"( tells a story about the river", "max_tokens": 48, )", sampling,
                        R"(, "ignore_eos": true, "stream": true})");
  };
  // The kills land mid-stream on a fast machine and on a loaded one alike: the prefill worker's
  // once the first stream has its first token (the other prompts are still being prefilled or
  // wait for it); a decode worker's once every stream has its first token, and the one with the
  // most sequences running then (the last stream to start has most of its tokens to go, so it
  // runs somewhere).
  std::vector<std::string> bodies;
  for (int i = 0; i < kStreams; ++i) bodies.push_back(body(i));
  const auto run = [&](bool chaos) {
    return StreamAll(port, bodies, [&](const std::function<void(int)>& await_streaming) {
      if (!chaos) return;
      await_streaming(1);
      const pid_t prefill = ChildWithRole(ChildrenOf(serve.pid()), "prefill");
      EXPECT_NE(prefill, -1);
      if (prefill != -1) kill(prefill, SIGKILL);
      await_streaming(kStreams);
      pid_t decode = -1;
      int most = -1;
      for (pid_t child : ChildrenOf(serve.pid())) {
        const int running = RunningSequences(child, serve.output());
        if (running > most) {
          most = running;
          decode = child;
        }
      }
      EXPECT_GT(most, 0) << "no decode worker is running a sequence";
      if (decode != -1) kill(decode, SIGKILL);
    });
  };
  const std::vector<std::string> reference = run(false);
  for (const std::string& t : reference) ASSERT_FALSE(t.empty() || t[0] == '<') << t;
  const std::vector<std::string> chaotic = run(true);
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(chaotic[i], reference[i]) << "stream " << i;
  // The kill landed mid-stream: streams were moved (else this test proved nothing).
  EXPECT_TRUE(WaitFor(
      [&] { return serve.output().find("tokens to another decode worker") != std::string::npos; },
      absl::Seconds(10)))
      << serve.output();
  ASSERT_TRUE(WaitFor([&] { return serve.output().find(" restarted (pid") != std::string::npos; },
                      absl::Seconds(30)));
  // Everyone back: the same streams again, after the restarts.
  EXPECT_TRUE(WaitFor([&] { return ChildrenOf(serve.pid()).size() == 5u; }, absl::Seconds(30)));
  absl::SleepFor(absl::Seconds(3));
  const std::vector<std::string> after = run(false);
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(after[i], reference[i]) << "stream " << i;
  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  EXPECT_NE(serve.Wait(absl::Seconds(60)), -1);
}

// Speculative decoding through a `tandem drafter` service (--speculative remote --drafters 1):
// killing the drafter with SIGKILL mid-run, and later freezing its restarted process with
// SIGSTOP, changes no stream's text (greedy and seeded ones): the decode worker drafts without
// it, never waits on it for longer than its deadline, and drafts through it again once it is
// back.
TEST_F(ServeTest, KilledOrFrozenDrafterMidRunChangesNoText) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port), "--aggregated", "--decode-workers", "1",
                      "--speculative", "remote", "--drafters", "1", "--request-timeout-s", "120"},
                     cache_dir_.string());
  ASSERT_EQ(StartServing(serve, port, 3).size(), 3u) << serve.output();
  constexpr int kStreams = 12;
  const auto body = [](int i) {
    const std::string sampling =
        i % 2 == 0 ? R"("temperature": 0)" : absl::StrCat(R"("temperature": 0.8, "seed": )", i);
    return absl::StrCat(R"({"model": "tiny", "prompt": "the the the river )", i,
                        R"( the the the river", "max_tokens": 600, )", sampling,
                        R"(, "ignore_eos": true, "stream": true})");
  };
  const auto run = [&](int signal) {
    std::vector<std::string> texts(kStreams);
    std::vector<std::thread> clients;
    for (int i = 0; i < kStreams; ++i) {
      clients.emplace_back(
          [&, i] { texts[i] = StreamText(HttpPost(port, "/v1/completions", body(i))); });
    }
    pid_t victim = -1;
    if (signal != 0) {
      absl::SleepFor(absl::Milliseconds(150));
      victim = ChildWithRole(ChildrenOf(serve.pid()), "drafter");
      EXPECT_NE(victim, -1);
      if (victim != -1) kill(victim, signal);
    }
    for (std::thread& t : clients) t.join();
    if (signal == SIGSTOP && victim != -1) kill(victim, SIGCONT);
    return texts;
  };
  const std::vector<std::string> reference = run(0);
  for (const std::string& t : reference) ASSERT_FALSE(t.empty() || t[0] == '<') << t;
  const std::vector<std::string> killed = run(SIGKILL);
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(killed[i], reference[i]) << "stream " << i;
  ASSERT_TRUE(
      WaitFor([&] { return serve.output().find("drafter-0 restarted") != std::string::npos; },
              absl::Seconds(30)))
      << serve.output();
  absl::SleepFor(absl::Seconds(2));
  const std::vector<std::string> frozen = run(SIGSTOP);
  for (int i = 0; i < kStreams; ++i) EXPECT_EQ(frozen[i], reference[i]) << "stream " << i;
  // The decode worker noticed (and counted) the drafter's absence.
  EXPECT_NE(serve.output().find("decoding without drafts"), std::string::npos) << serve.output();
  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  EXPECT_NE(serve.Wait(absl::Seconds(60)), -1);
}

// The MLP elsewhere (issue 26): on the bundled model, greedy completions with --mlp cpu, and
// with --mlp remote on one shard and on two (each serving both attention workers, in both
// serving modes), are the text of --mlp local. The bundled model is the repository's
// models/target (the tiny random one when a checkout lacks it).
TEST_F(ServeTest, MlpOffloadGivesTheLocalGreedyText) {
  const std::string bundled = absl::StrCat(TANDEM_SOURCE_DIR, "/models/target");
  const bool have_bundled = fs::exists(fs::path(bundled) / "config.json");
  const std::string model = have_bundled ? "target" : "tiny";
  constexpr int kPrompts = 6;
  const auto run = [&](std::vector<std::string> flags, size_t children) {
    const int port = FreePort();
    flags.insert(flags.end(), {"--port", std::to_string(port)});
    if (have_bundled) flags.insert(flags.end(), {"--model", bundled});
    ServeProcess serve(flags, cache_dir_.string());
    std::vector<std::string> texts(kPrompts);
    if (StartServing(serve, port, children).size() != children) return texts;
    std::vector<std::thread> clients;
    for (int i = 0; i < kPrompts; ++i) {
      clients.emplace_back([&, i] {
        const std::string response = HttpPost(
            port, "/v1/completions",
            absl::StrCat(R"({"model": ")", model, R"(", "prompt": "Prompt )", i,
                         R"(: the cache and the scheduler", "max_tokens": 32, "temperature": 0,
                         "ignore_eos": true})"));
        const size_t body = response.find("\r\n\r\n");
        const nlohmann::json j = nlohmann::json::parse(
            body == std::string::npos ? "" : response.substr(body + 4), nullptr, false);
        texts[i] = j.is_object() && j.contains("choices")
                       ? j["choices"][0]["text"].get<std::string>()
                       : "<bad answer> " + response;
      });
    }
    for (std::thread& t : clients) t.join();
    if (flags[1] == "remote") {
      EXPECT_NE(serve.output().find("given to the KV cache"), std::string::npos) << serve.output();
    }
    if (std::find(flags.begin(), flags.end(), "--mlp-data-plane") != flags.end()) {
      // The rows went through the host data plane, not in the messages.
      EXPECT_GT(ChildMetric(serve.output(), "decode-0", "tandem_mlp_plane_calls_total"), 0)
          << serve.output();
    }
    EXPECT_EQ(kill(serve.pid(), SIGINT), 0);
    EXPECT_NE(serve.Wait(absl::Seconds(60)), -1);
    return texts;
  };
  const std::vector<std::string> local = run({"--aggregated", "--decode-workers", "2"}, 3);
  for (const std::string& t : local) ASSERT_FALSE(t.empty() || t[0] == '<') << t;
  // The text is what is compared: a generous layer deadline, so a host loaded by other tests
  // (CI's two cores) cannot turn a slow shard into a failed request (the deadline's own path is
  // KillingTheMlpShardMidRunEndsEveryStream's and remote_mlp_test's).
  const std::vector<std::vector<std::string>> setups = {
      {"--mlp", "cpu", "--aggregated", "--decode-workers", "2"},
      {"--mlp", "remote", "--mlp-shards", "1", "--aggregated", "--decode-workers", "2",
       "--mlp-call-timeout-ms", "60000"},
      {"--mlp", "remote", "--mlp-shards", "2", "--aggregated", "--decode-workers", "2",
       "--mlp-call-timeout-ms", "60000"},
      {"--mlp", "remote", "--mlp-shards", "2", "--prefill-workers", "1", "--decode-workers", "2",
       "--mlp-call-timeout-ms", "60000"},
      {"--mlp", "remote", "--mlp-shards", "2", "--aggregated", "--decode-workers", "2",
       "--mlp-call-timeout-ms", "60000", "--mlp-data-plane", "cma"},
  };
  const std::vector<size_t> children = {3, 4, 5, 6, 5};
  for (size_t k = 0; k < setups.size(); ++k) {
    const std::vector<std::string> texts = run(setups[k], children[k]);
    for (int i = 0; i < kPrompts; ++i) {
      EXPECT_EQ(texts[i], local[i]) << absl::StrJoin(setups[k], " ") << ", prompt " << i;
    }
  }
}

// Killing the MLP shard mid-run never hangs a stream: with --mlp-fallback cpu every stream
// completes with the unfaulted text; without a fallback each stream completes or ends with an
// error event and [DONE], and the restarted shard serves new requests.
TEST_F(ServeTest, KillingTheMlpShardMidRunEndsEveryStream) {
  constexpr int kStreams = 6;
  const auto body = [](int i) {
    return absl::StrCat(R"({"model": "tiny", "prompt": "Stream )", i,
                        R"( about the river", "max_tokens": 400, "temperature": 0,
                        "ignore_eos": true, "stream": true})");
  };
  for (const std::string fallback : {"cpu", "none"}) {
    const int port = FreePort();
    ServeProcess serve(
        {"--port", std::to_string(port), "--aggregated", "--decode-workers", "1", "--mlp", "remote",
         "--mlp-shards", "1", "--mlp-fallback", fallback, "--request-timeout-s", "120"},
        cache_dir_.string());
    ASSERT_EQ(StartServing(serve, port, 3).size(), 3u) << serve.output();
    std::vector<std::string> bodies;
    for (int i = 0; i < kStreams; ++i) bodies.push_back(body(i));
    const auto run = [&](bool kill_shard) {
      return StreamAll(port, bodies, [&](const std::function<void(int)>& await_streaming) {
        if (!kill_shard) return;
        await_streaming(kStreams);
        const pid_t shard = ChildWithRole(ChildrenOf(serve.pid()), "mlp-shard");
        EXPECT_NE(shard, -1);
        if (shard != -1) kill(shard, SIGKILL);
      });
    };
    const std::vector<std::string> reference = run(false);
    for (const std::string& t : reference) ASSERT_FALSE(t.empty() || t[0] == '<') << t;
    const std::vector<std::string> faulted = run(true);
    int errors = 0;
    for (int i = 0; i < kStreams; ++i) {
      if (fallback == "cpu") {
        EXPECT_EQ(faulted[i], reference[i]) << "stream " << i;
      } else {
        // Completed as unfaulted, or ended with an error event and [DONE] (never cut).
        EXPECT_TRUE(faulted[i] == reference[i] || faulted[i] == "<error>") << faulted[i];
        errors += faulted[i] == "<error>";
      }
    }
    // The worker counted it.
    EXPECT_GT(ChildMetric(serve.output(), "decode-0", "tandem_mlp_calls_total"), 0);
    if (fallback == "cpu") {
      EXPECT_GT(ChildMetric(serve.output(), "decode-0", "tandem_mlp_failovers_total"), 0);
      EXPECT_EQ(ChildMetric(serve.output(), "decode-0", "tandem_mlp_failures_total"), 0);
    } else {
      EXPECT_GT(errors, 0) << "the kill landed after every stream had finished";
      EXPECT_GT(ChildMetric(serve.output(), "decode-0", "tandem_mlp_failures_total"), 0);
    }
    // The shard is restarted and serves again (a worker backs off a failed shard for at most
    // 10 s).
    ASSERT_TRUE(
        WaitFor([&] { return serve.output().find("mlp-shard-0 restarted") != std::string::npos; },
                absl::Seconds(30)))
        << serve.output();
    EXPECT_TRUE(WaitFor(
        [&] {
          const std::string r =
              HttpPost(port, "/v1/completions",
                       R"({"model": "tiny", "prompt": "Hi", "max_tokens": 2, "temperature": 0})");
          return r.find("\"text\"") != std::string::npos;
        },
        absl::Seconds(30)))
        << serve.output();
    ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
    EXPECT_NE(serve.Wait(absl::Seconds(60)), -1);
  }
}

// A worker killed with SIGKILL is started again (same port) while the others keep serving, and
// takes requests again; the same for the prefill worker.
TEST_F(ServeTest, AKilledWorkerIsRestartedAndServesAgain) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port)}, cache_dir_.string());
  std::vector<pid_t> children = StartServing(serve, port);
  ASSERT_EQ(children.size(), 3u) << serve.output();
  const auto completes = [&] {
    const std::string r =
        HttpPost(port, "/v1/completions",
                 R"({"model": "tiny", "prompt": "Hi", "max_tokens": 2, "temperature": 0})");
    return r.rfind("HTTP/1.1 200", 0) == 0;
  };
  ASSERT_TRUE(completes()) << serve.output();
  for (const char* role : {"decode", "prefill"}) {
    SCOPED_TRACE(role);
    const pid_t victim = ChildWithRole(ChildrenOf(serve.pid()), role);
    ASSERT_NE(victim, -1) << serve.output();
    ASSERT_EQ(kill(victim, SIGKILL), 0);
    ASSERT_TRUE(serve.WaitForOutput(absl::StrCat(role, "-0 restarted"), absl::Seconds(30)))
        << serve.output();
    // Routed again once the router sees it healthy (its reconnect backoff is at most 2 s).
    EXPECT_TRUE(WaitFor(completes, absl::Seconds(30))) << serve.output();
    EXPECT_EQ(ChildrenOf(serve.pid()).size(), 3u);
    EXPECT_NE(ChildWithRole(ChildrenOf(serve.pid()), role), victim);
  }
  ASSERT_EQ(kill(serve.pid(), SIGINT), 0);
  const int status = serve.Wait(absl::Seconds(40));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status << "\n" << serve.output();
}

TEST_F(ServeTest, ADeadChildStopsTheRestWithAnError) {
  const int port = FreePort();
  ServeProcess serve({"--port", std::to_string(port), "--aggregated", "--max-restarts", "0"},
                     cache_dir_.string());
  const std::vector<pid_t> children = StartServing(serve, port, 2);
  ASSERT_EQ(children.size(), 2u) << "router and decode-0 only";
  // Kill the decode worker (not the router: the one whose command line says decode).
  pid_t decode = -1;
  for (pid_t child : children) {
    std::ifstream cmdline(absl::StrCat("/proc/", child, "/cmdline"));
    std::string text((std::istreambuf_iterator<char>(cmdline)), std::istreambuf_iterator<char>());
    if (text.find(std::string("decode\0", 7)) != std::string::npos &&
        text.find(std::string("router\0", 7)) == std::string::npos) {
      decode = child;
    }
  }
  ASSERT_NE(decode, -1);
  kill(decode, SIGKILL);
  const int status = serve.Wait(absl::Seconds(40));
  ASSERT_NE(status, -1) << serve.output();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << status;
  EXPECT_NE(serve.output().find("decode-0 killed by signal 9 unexpectedly"), std::string::npos)
      << serve.output();
  for (pid_t child : children) EXPECT_TRUE(IsDead(child)) << "orphan " << child;
}

}  // namespace
