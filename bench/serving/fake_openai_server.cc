// fake_openai_server: a trivial OpenAI-compatible streaming endpoint for testing and measuring
// `tandem bench` (no model: it streams words).
//
//   fake_openai_server [--host 127.0.0.1] [--port 0] [--model fake-model] [--tokens 16]
//                      [--ttft-ms 0] [--itl-ms 0] [--fail MODE] [--fail-every K] [--threads 1]
//
// POST /v1/chat/completions and /v1/completions with "stream": true stream `max_tokens` (else
// --tokens) chunks of one word each, in OpenAI's SSE format over HTTP/1.1 chunked encoding, the
// first after --ttft-ms and the rest --itl-ms apart; then a finish chunk, a usage chunk when
// `stream_options.include_usage`, and `data: [DONE]`. Prompt tokens are counted as the words of
// the prompt (or of all message contents). GET /v1/models lists --model; GET /metrics reports
// tandem_requests_total{code,endpoint}, tandem_prompt_tokens_total and
// tandem_generation_tokens_total over finished streams, as the router does.
//
// Failure modes (--fail, applied to every K-th request with --fail-every K, default every one):
//   http500      a 500 response with an OpenAI error body
//   reset        half the tokens, then a TCP reset
//   malformed    half the tokens, then an event that is not JSON
//   stall        half the tokens, then nothing (the connection stays open)
//   error-event  half the tokens, then `data: {"error": ...}` and [DONE]
//   truncate     half the tokens, then the end of the HTTP body without [DONE]
//
// Prints "fake_openai_server listening on PORT" on stdout when ready; runs until killed.
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "nlohmann/json.hpp"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;
using json = nlohmann::json;

enum class FailMode { kNone, kHttp500, kReset, kMalformed, kStall, kErrorEvent, kTruncate };

struct Config {
  std::string model = "fake-model";
  int tokens = 16;
  double ttft_ms = 0;
  double itl_ms = 0;
  FailMode fail = FailMode::kNone;
  int fail_every = 1;
};

constexpr const char* kWords[] = {" the", " of", " and", " to", " in", " is", " you", " that"};

struct Counters {
  std::atomic<int64_t> requests{0};
  std::atomic<int64_t> prompt_tokens{0};
  std::atomic<int64_t> generation_tokens{0};
  absl::Mutex mu;
  std::map<std::pair<std::string, int>, int64_t> by_endpoint_code ABSL_GUARDED_BY(mu);

  void Finished(const std::string& endpoint, int code) {
    absl::MutexLock lock(&mu);
    ++by_endpoint_code[{endpoint, code}];
  }
  std::string Prometheus() {
    std::string out = "# TYPE tandem_requests_total counter\n";
    {
      absl::MutexLock lock(&mu);
      for (const auto& [key, n] : by_endpoint_code) {
        absl::StrAppend(&out, "tandem_requests_total{code=\"", key.second, "\",endpoint=\"",
                        key.first, "\"} ", n, "\n");
      }
    }
    absl::StrAppend(&out, "# TYPE tandem_prompt_tokens_total counter\ntandem_prompt_tokens_total ",
                    prompt_tokens.load(), "\n",
                    "# TYPE tandem_generation_tokens_total counter\n"
                    "tandem_generation_tokens_total ",
                    generation_tokens.load(), "\n");
    return out;
  }
};

int CountWords(const std::string& s) {
  return static_cast<int>(
      std::vector<absl::string_view>(absl::StrSplit(s, absl::ByAnyChar(" \t\n"), absl::SkipEmpty()))
          .size());
}

std::string Chunked(absl::string_view data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const Config& config, Counters& counters)
      : socket_(std::move(socket)),
        config_(config),
        counters_(counters),
        timer_(socket_.get_executor()) {}

  void Start() { ReadRequest(); }

 private:
  void ReadRequest() {
    request_ = {};
    parser_.emplace();
    parser_->body_limit(64 << 20);
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](const error_code& ec, size_t) {
                       if (ec) return self->Shutdown();
                       self->request_ = self->parser_->release();
                       self->Handle();
                     });
  }

  void Shutdown() {
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  void WriteSimple(int status, const std::string& content_type, std::string body) {
    out_ = absl::StrCat("HTTP/1.1 ", status, status == 200 ? " OK" : " Error",
                        "\r\nContent-Type: ", content_type, "\r\nContent-Length: ", body.size(),
                        "\r\n\r\n", body);
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this()](const error_code& ec, size_t) {
                        if (ec) return self->Shutdown();
                        self->ReadRequest();
                      });
  }

  static std::string ErrorBody(const std::string& message, const std::string& type, int code) {
    return json{{"error", {{"message", message}, {"type", type}, {"code", code}}}}.dump();
  }

  void Handle() {
    const std::string target(request_.target());
    if (request_.method() == http::verb::get && target == "/metrics") {
      return WriteSimple(200, "text/plain; version=0.0.4", counters_.Prometheus());
    }
    if (request_.method() == http::verb::get && target == "/v1/models") {
      return WriteSimple(200, "application/json",
                         json{{"object", "list"},
                              {"data", json::array({{{"id", config_.model}, {"object", "model"}}})}}
                             .dump());
    }
    if (request_.method() != http::verb::post ||
        (target != "/v1/chat/completions" && target != "/v1/completions")) {
      return WriteSimple(404, "application/json", ErrorBody("not found", "NotFoundError", 404));
    }
    endpoint_ = target;
    chat_ = target == "/v1/chat/completions";
    json body = json::parse(request_.body(), nullptr, false);
    if (body.is_discarded() || !body.is_object() || !body.value("stream", false)) {
      counters_.Finished(endpoint_, 400);
      return WriteSimple(
          400, "application/json",
          ErrorBody("expected a JSON object with \"stream\": true", "BadRequestError", 400));
    }
    prompt_tokens_ = 0;
    try {
      if (chat_) {
        for (const json& m : body.at("messages")) {
          prompt_tokens_ += CountWords(m.at("content").get<std::string>());
        }
      } else {
        prompt_tokens_ = CountWords(body.at("prompt").get<std::string>());
      }
    } catch (const json::exception& e) {
      counters_.Finished(endpoint_, 400);
      return WriteSimple(400, "application/json", ErrorBody(e.what(), "BadRequestError", 400));
    }
    n_tokens_ = config_.tokens;
    if (body.contains("max_tokens") && body["max_tokens"].is_number_integer()) {
      n_tokens_ = body["max_tokens"].get<int>();
    }
    include_usage_ = body.contains("stream_options") && body["stream_options"].is_object() &&
                     body["stream_options"].value("include_usage", false);
    const int64_t index = ++counters_.requests;
    fail_ = config_.fail != FailMode::kNone && index % config_.fail_every == 0;
    id_ = absl::StrCat(chat_ ? "chatcmpl-" : "cmpl-", index);
    if (fail_ && config_.fail == FailMode::kHttp500) {
      counters_.Finished(endpoint_, 500);
      return WriteSimple(500, "application/json",
                         ErrorBody("injected failure", "InternalServerError", 500));
    }
    sent_ = 0;
    out_ =
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    if (chat_) {
      out_ += Chunked(Event(
          absl::StrCat(R"({"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,)"
                       R"("finish_reason":null})")));
    }
    Send([self = shared_from_this()] { self->Wait(self->config_.ttft_ms); });
  }

  std::string Event(absl::string_view choice) {
    return absl::StrCat("data: {\"id\":\"", id_, "\",\"object\":\"",
                        chat_ ? "chat.completion.chunk" : "text_completion",
                        "\",\"created\":1700000000,\"model\":\"", config_.model, "\",\"choices\":[",
                        choice, "]}\n\n");
  }

  std::string TokenEvent(int i) {
    const char* w = kWords[i % 8];
    if (chat_) {
      return Event(absl::StrCat(R"({"index":0,"delta":{"content":")", w,
                                R"("},"logprobs":null,"finish_reason":null})"));
    }
    return Event(
        absl::StrCat(R"({"index":0,"text":")", w, R"(","logprobs":null,"finish_reason":null})"));
  }

  template <typename Next>
  void Send(Next next) {
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this(), next](const error_code& ec, size_t) {
                        if (ec) return self->Shutdown();
                        next();
                      });
  }

  void Wait(double ms) {
    if (ms <= 0) return Step();
    timer_.expires_after(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
    timer_.async_wait([self = shared_from_this()](const error_code& ec) {
      if (ec) return self->Shutdown();
      self->Step();
    });
  }

  // Sends the next token, or the failure, or the end of the stream.
  void Step() {
    if (fail_ && sent_ >= n_tokens_ / 2) return Fail();
    if (sent_ < n_tokens_) {
      out_ = Chunked(TokenEvent(sent_));
      ++sent_;
      return Send([self = shared_from_this()] { self->Wait(self->config_.itl_ms); });
    }
    const std::string finish =
        chat_ ? R"({"index":0,"delta":{},"logprobs":null,"finish_reason":"length"})"
              : R"({"index":0,"text":"","logprobs":null,"finish_reason":"length"})";
    out_ = Chunked(Event(finish));
    if (include_usage_) {
      out_ +=
          Chunked(absl::StrCat("data: {\"id\":\"", id_, "\",\"object\":\"",
                               chat_ ? "chat.completion.chunk" : "text_completion",
                               "\",\"created\":1700000000,\"model\":\"", config_.model,
                               "\",\"choices\":[],\"usage\":{\"prompt_tokens\":", prompt_tokens_,
                               ",\"completion_tokens\":", sent_,
                               ",\"total_tokens\":", prompt_tokens_ + sent_, "}}\n\n"));
    }
    out_ += Chunked("data: [DONE]\n\n");
    out_ += "0\r\n\r\n";
    counters_.Finished(endpoint_, 200);
    counters_.prompt_tokens += prompt_tokens_;
    counters_.generation_tokens += sent_;
    Send([self = shared_from_this()] { self->ReadRequest(); });
  }

  void Fail() {
    switch (config_.fail) {
      case FailMode::kNone:
      case FailMode::kHttp500:
        return;
      case FailMode::kReset: {
        error_code ignored;
        socket_.set_option(asio::socket_base::linger(true, 0), ignored);
        socket_.close(ignored);
        return;
      }
      case FailMode::kMalformed:
        out_ = Chunked("data: {\"choices\": [this is not json\n\n");
        return Send([self = shared_from_this()] { self->Hold(); });
      case FailMode::kStall:
        return Hold();
      case FailMode::kErrorEvent:
        out_ = Chunked(
            absl::StrCat("data: ", ErrorBody("injected error", "InternalError", 500), "\n\n"));
        out_ += Chunked("data: [DONE]\n\n");
        out_ += "0\r\n\r\n";
        return Send([self = shared_from_this()] { self->ReadRequest(); });
      case FailMode::kTruncate:
        out_ = "0\r\n\r\n";
        return Send([self = shared_from_this()] { self->ReadRequest(); });
    }
  }

  // Sends nothing more; the session ends when the client closes the connection.
  void Hold() {
    socket_.async_read_some(asio::buffer(sink_),
                            [self = shared_from_this()](const error_code& ec, size_t) {
                              if (ec) return self->Shutdown();
                              self->Hold();
                            });
  }

  tcp::socket socket_;
  const Config& config_;
  Counters& counters_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::request<http::string_body> request_;
  std::string out_;
  std::string endpoint_;
  std::string id_;
  bool chat_ = true;
  bool include_usage_ = false;
  bool fail_ = false;
  int prompt_tokens_ = 0;
  int n_tokens_ = 0;
  int sent_ = 0;
  std::array<char, 512> sink_;
};

void Accept(tcp::acceptor& acceptor, const Config& config, Counters& counters) {
  acceptor.async_accept([&](const error_code& ec, tcp::socket socket) {
    if (!ec) {
      error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);
      std::make_shared<Session>(std::move(socket), config, counters)->Start();
    }
    Accept(acceptor, config, counters);
  });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Trivial OpenAI-compatible streaming endpoint (tests and client benchmarks)",
               "fake_openai_server"};
  Config config;
  std::string host = "127.0.0.1";
  int port = 0;
  int threads = 1;
  std::string fail = "none";
  app.add_option("--host", host);
  app.add_option("--port", port, "0 picks a free port");
  app.add_option("--model", config.model);
  app.add_option("--tokens", config.tokens, "tokens per request without max_tokens");
  app.add_option("--ttft-ms", config.ttft_ms);
  app.add_option("--itl-ms", config.itl_ms);
  app.add_option("--fail", fail)
      ->check(CLI::IsMember(
          {"none", "http500", "reset", "malformed", "stall", "error-event", "truncate"}));
  app.add_option("--fail-every", config.fail_every)->check(CLI::PositiveNumber);
  app.add_option("--threads", threads)->check(CLI::PositiveNumber);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  const std::map<std::string, FailMode> modes = {
      {"none", FailMode::kNone},        {"http500", FailMode::kHttp500},
      {"reset", FailMode::kReset},      {"malformed", FailMode::kMalformed},
      {"stall", FailMode::kStall},      {"error-event", FailMode::kErrorEvent},
      {"truncate", FailMode::kTruncate}};
  config.fail = modes.at(fail);

  rlimit lim{};  // one socket per stream: lift the soft open-file limit to the hard one
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  asio::io_context io(threads);
  tcp::acceptor acceptor(io);
  error_code ec;
  const tcp::endpoint ep(asio::ip::make_address(host, ec), static_cast<uint16_t>(port));
  if (ec) {
    std::cerr << "fake_openai_server: bad --host: " << ec.message() << "\n";
    return 2;
  }
  acceptor.open(ep.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(ep, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    std::cerr << "fake_openai_server: cannot listen on " << host << ":" << port << ": "
              << ec.message() << "\n";
    return 1;
  }
  Counters counters;
  Accept(acceptor, config, counters);
  std::printf("fake_openai_server listening on %d\n", acceptor.local_endpoint().port());
  std::fflush(stdout);
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
  return 0;
}
