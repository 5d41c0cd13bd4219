// The only translation unit that includes Boost.Beast/Asio (they are slow to compile).
//
// Per connection, a Session lives on its own strand and goes through phases:
//   kReading   header (idle_timeout) then body (read_timeout) of the next request;
//   kHandling  the handler has an Exchange; the socket is watched for EOF/reset meanwhile;
//   kLingering response done with Connection: close; the send side is shut, and the rest of
//              the client's data is drained briefly so it reads the response rather than a reset;
//   kClosed.
// Responses are formatted here as bytes (status line, headers, body or chunks) and written from
// a queue one buffer at a time, each under write_timeout.
#include "runtime/router/http_server.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <exception>
#include <optional>
#include <thread>
#include <unordered_map>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "runtime/base/logging.h"

namespace tandem::router {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string HttpRequest::Header(absl::string_view name) const {
  for (const auto& [key, value] : headers) {
    if (absl::EqualsIgnoreCase(key, name)) return value;
  }
  return "";
}

namespace {

constexpr absl::Duration kLingerTimeout = absl::Seconds(2);
constexpr size_t kMaxLingerBytes = 16 << 20;

std::chrono::nanoseconds ToChrono(absl::Duration d) {
  if (d >= absl::Hours(24 * 365)) return std::chrono::hours(24 * 365);
  return absl::ToChronoNanoseconds(d);
}

std::string StatusLine(int status) {
  const beast::string_view reason = http::obsolete_reason(http::int_to_status(status));
  return absl::StrCat("HTTP/1.1 ", status, " ",
                      reason.empty() ? std::string("Unknown") : std::string(reason), "\r\n");
}

std::string FormatHeaders(const HttpHeaders& headers) {
  std::string out;
  for (const auto& [key, value] : headers) absl::StrAppend(&out, key, ": ", value, "\r\n");
  return out;
}

// Exchanges post into the io_context only while this gate is open (closed by Stop before the
// io_context stops), so an exchange that outlives the server never touches it.
struct Gate {
  absl::Mutex mu;
  bool open ABSL_GUARDED_BY(mu) = true;
};

class HttpServerImpl;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServerImpl* server);
  ~Session();

  void Start();
  net::any_io_executor executor() { return stream_.get_executor(); }

  // Strand-only: what the Exchange of request `seq` asked for.
  void DoRespond(uint64_t seq, HttpResponse response);
  void DoStartStream(uint64_t seq, int status, const std::string& content_type,
                     const HttpHeaders& headers);
  void DoWriteChunk(uint64_t seq, const std::string& data);
  void DoEndStream(uint64_t seq);
  void DoSetCloseHandler(uint64_t seq, std::function<void()> on_close);
  void DoRelease(uint64_t seq);
  // Strand-only: server shutdown.
  void OnServerStopping();
  void Close();

 private:
  enum class Phase { kReading, kHandling, kLingering, kClosed };

  void DoReadHeader();
  void OnHeader(beast::error_code ec, size_t bytes);
  void ReadBody();
  void OnBody(beast::error_code ec, size_t bytes);
  void OnReadError(beast::error_code ec);
  void RespondEarly(int status, const std::string& message);
  void StartWatch();
  void OnWatch(beast::error_code ec, size_t bytes);
  void Enqueue(std::string bytes);
  void DoWrite();
  void OnWrite(beast::error_code ec, size_t bytes);
  void FinishResponse();
  void StartLinger();
  void ReadLinger();

  HttpServerImpl* server_;
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::array<char, 4096> scratch_;
  bool registered_ = false;

  Phase phase_ = Phase::kReading;
  uint64_t seq_ = 0;  // the current request's exchange
  bool keep_alive_ = false;
  bool http10_ = false;  // an HTTP/1.0 client: no chunked encoding, streams end at close
  bool response_started_ = false;
  bool streaming_ = false;
  bool response_queued_ = false;  // the whole response is in writes_
  bool response_done_ = false;    // ... and has been written
  std::function<void()> on_close_;
  std::deque<std::string> writes_;
  bool writing_ = false;
  bool watching_ = false;          // a raw read is pending on the socket (kHandling/kLingering)
  bool read_after_watch_ = false;  // the watch was cancelled to read the next request
  size_t linger_bytes_ = 0;
};

class Exchange : public HttpExchange {
 public:
  Exchange(std::weak_ptr<Session> session, std::shared_ptr<Gate> gate, uint64_t seq)
      : session_(std::move(session)), gate_(std::move(gate)), seq_(seq) {}
  ~Exchange() override {
    Post([seq = seq_](Session& s) { s.DoRelease(seq); });
  }

  void Respond(HttpResponse response) override {
    Post([seq = seq_, r = std::move(response)](Session& s) mutable {
      s.DoRespond(seq, std::move(r));
    });
  }
  void StartStream(int status, std::string content_type, HttpHeaders headers) override {
    Post([seq = seq_, status, ct = std::move(content_type), h = std::move(headers)](Session& s) {
      s.DoStartStream(seq, status, ct, h);
    });
  }
  void WriteChunk(std::string data) override {
    if (data.empty()) return;
    Post([seq = seq_, d = std::move(data)](Session& s) { s.DoWriteChunk(seq, d); });
  }
  void EndStream() override {
    Post([seq = seq_](Session& s) { s.DoEndStream(seq); });
  }
  void SetCloseHandler(std::function<void()> on_close) override {
    Post([seq = seq_, f = std::move(on_close)](Session& s) mutable {
      s.DoSetCloseHandler(seq, std::move(f));
    });
  }

 private:
  template <typename F>
  void Post(F fn) {
    absl::MutexLock lock(&gate_->mu);
    if (!gate_->open) return;
    std::shared_ptr<Session> session = session_.lock();
    if (session == nullptr) return;
    net::post(session->executor(), [session, fn = std::move(fn)]() mutable { fn(*session); });
  }

  std::weak_ptr<Session> session_;
  std::shared_ptr<Gate> gate_;
  uint64_t seq_;
};

class HttpServerImpl : public HttpServer {
 public:
  HttpServerImpl(HttpServerOptions options, HttpHandler handler)
      : options_(std::move(options)),
        handler_(std::move(handler)),
        gate_(std::make_shared<Gate>()),
        acceptor_(net::make_strand(ioc_)) {
    if (!options_.error_response) {
      options_.error_response = [](int status, const std::string& message) {
        return HttpResponse{status, "text/plain; charset=utf-8", {}, message + "\n"};
      };
    }
  }
  ~HttpServerImpl() override { Stop(); }

  absl::Status Listen() {
    beast::error_code ec;
    const std::string host = options_.host == "localhost" ? "127.0.0.1" : options_.host;
    const net::ip::address address = net::ip::make_address(host, ec);
    if (ec) return absl::InvalidArgumentError(absl::StrCat("bad listen address '", host, "'"));
    if (options_.port < 0 || options_.port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("bad port ", options_.port));
    }
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen on ", host, ":", options_.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    return absl::OkStatus();
  }

  void Run() {
    DoAccept();
    const int n = std::max(1, options_.num_threads);
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        for (;;) {
          try {
            ioc_.run();
            return;
          } catch (const std::exception& e) {
            LOG(ERROR) << "http server: handler threw: " << e.what();
          }
        }
      });
    }
  }

  int port() const override { return port_; }

  void Stop() override {
    if (stopped_.exchange(true)) return;
    stopping_.store(true);
    net::post(acceptor_.get_executor(), [this] {
      beast::error_code ec;
      acceptor_.close(ec);
    });
    ForEachSession([](Session& s) { s.OnServerStopping(); });
    WaitForSessions(options_.shutdown_grace);
    ForEachSession([](Session& s) { s.Close(); });
    WaitForSessions(absl::Seconds(2));
    {
      absl::MutexLock lock(&gate_->mu);
      gate_->open = false;
    }
    work_.reset();
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  // Called by sessions.
  const HttpServerOptions& options() const { return options_; }
  const HttpHandler& handler() const { return handler_; }
  const std::shared_ptr<Gate>& gate() const { return gate_; }
  bool stopping() const { return stopping_.load(); }
  void Register(Session* s, std::weak_ptr<Session> weak) {
    absl::MutexLock lock(&mu_);
    sessions_[s] = std::move(weak);
    ++open_sessions_;
  }
  // A session's connection closed; it may live on while exchanges refer to it.
  void SessionClosed() {
    absl::MutexLock lock(&mu_);
    --open_sessions_;
  }
  void Unregister(Session* s) {
    absl::MutexLock lock(&mu_);
    sessions_.erase(s);
  }

 private:
  void DoAccept() {
    acceptor_.async_accept(
        net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
          if (!acceptor_.is_open() || ec == net::error::operation_aborted) return;
          if (ec) {
            // E.g. out of file descriptors: back off instead of spinning.
            LOG(WARNING) << "http server: accept failed: " << ec.message();
            auto timer = std::make_shared<net::steady_timer>(acceptor_.get_executor());
            timer->expires_after(std::chrono::milliseconds(50));
            timer->async_wait([this, timer](beast::error_code) {
              if (acceptor_.is_open()) DoAccept();
            });
            return;
          }
          beast::error_code ignored;
          socket.set_option(tcp::no_delay(true), ignored);
          std::make_shared<Session>(std::move(socket), this)->Start();
          DoAccept();
        });
  }

  template <typename F>
  void ForEachSession(F fn) {
    std::vector<std::shared_ptr<Session>> live;
    {
      absl::MutexLock lock(&mu_);
      for (auto& [ptr, weak] : sessions_) {
        if (auto s = weak.lock()) live.push_back(std::move(s));
      }
    }
    for (auto& s : live) net::post(s->executor(), [s, fn] { fn(*s); });
  }

  void WaitForSessions(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return open_sessions_ == 0; };
    mu_.AwaitWithTimeout(absl::Condition(&none), timeout);
  }

  HttpServerOptions options_;
  HttpHandler handler_;
  std::shared_ptr<Gate> gate_;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> stopped_{false};
  absl::Mutex mu_;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions_ ABSL_GUARDED_BY(mu_);
  int open_sessions_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::thread> threads_;
  // Declared after everything sessions use, so destroyed before it: its queued handlers own
  // sessions, whose destructors unregister from sessions_.
  net::io_context ioc_;
  // Keeps the io threads running while no operation is pending (exchanges may still post).
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work_{
      ioc_.get_executor()};
  tcp::acceptor acceptor_;
};

Session::Session(tcp::socket socket, HttpServerImpl* server)
    : server_(server), stream_(std::move(socket)) {}

Session::~Session() {
  if (!registered_) return;
  if (phase_ != Phase::kClosed) server_->SessionClosed();
  server_->Unregister(this);
}

void Session::Start() {
  server_->Register(this, weak_from_this());
  registered_ = true;
  net::dispatch(stream_.get_executor(), [self = shared_from_this()] {
    if (self->server_->stopping()) {
      self->Close();
    } else {
      self->DoReadHeader();
    }
  });
}

void Session::DoReadHeader() {
  phase_ = Phase::kReading;
  parser_.emplace();
  parser_->body_limit(server_->options().max_body_bytes);
  parser_->header_limit(static_cast<uint32_t>(server_->options().max_header_bytes));
  stream_.expires_after(ToChrono(server_->options().idle_timeout));
  http::async_read_header(stream_, buffer_, *parser_,
                          beast::bind_front_handler(&Session::OnHeader, shared_from_this()));
}

void Session::OnHeader(beast::error_code ec, size_t /*bytes*/) {
  if (phase_ != Phase::kReading) return;
  if (ec) return OnReadError(ec);
  if (server_->stopping()) return Close();
  const auto& req = parser_->get();
  if (absl::EqualsIgnoreCase(std::string(req[http::field::expect]), "100-continue")) {
    static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
    stream_.expires_after(ToChrono(server_->options().write_timeout));
    net::async_write(stream_, net::buffer(kContinue),
                     [self = shared_from_this()](beast::error_code wec, size_t) {
                       if (self->phase_ != Phase::kReading) return;
                       if (wec) return self->Close();
                       self->ReadBody();
                     });
    return;
  }
  ReadBody();
}

void Session::ReadBody() {
  stream_.expires_after(ToChrono(server_->options().read_timeout));
  http::async_read(stream_, buffer_, *parser_,
                   beast::bind_front_handler(&Session::OnBody, shared_from_this()));
}

void Session::OnReadError(beast::error_code ec) {
  if (ec == http::error::body_limit) {
    return RespondEarly(
        413, absl::StrCat("request body exceeds ", server_->options().max_body_bytes, " bytes"));
  }
  if (ec == http::error::header_limit) {
    return RespondEarly(431, "request header too large");
  }
  if (ec.category() == beast::error_code(http::error::bad_target).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return RespondEarly(400, absl::StrCat("malformed HTTP request: ", ec.message()));
  }
  Close();  // EOF, reset, timeout, partial message
}

void Session::OnBody(beast::error_code ec, size_t /*bytes*/) {
  if (phase_ != Phase::kReading) return;
  if (ec) return OnReadError(ec);
  http::request<http::string_body> msg = parser_->release();
  parser_.reset();

  HttpRequest request;
  request.method = std::string(msg.method_string());
  request.target = std::string(msg.target());
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : msg) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(msg.body());

  phase_ = Phase::kHandling;
  ++seq_;
  http10_ = msg.version() < 11;
  keep_alive_ = msg.keep_alive() && !server_->stopping();
  response_started_ = false;
  streaming_ = false;
  response_queued_ = false;
  response_done_ = false;
  on_close_ = nullptr;
  stream_.expires_never();
  StartWatch();

  auto exchange = std::make_shared<Exchange>(weak_from_this(), server_->gate(), seq_);
  try {
    server_->handler()(std::move(request), exchange);
  } catch (const std::exception& e) {
    LOG(ERROR) << "http server: handler threw: " << e.what();
    DoRespond(seq_, server_->options().error_response(500, "internal error"));
  }
}

void Session::RespondEarly(int status, const std::string& message) {
  phase_ = Phase::kHandling;
  ++seq_;
  keep_alive_ = false;
  response_started_ = true;
  response_done_ = false;
  streaming_ = false;
  on_close_ = nullptr;
  HttpResponse r = server_->options().error_response(status, message);
  r.status = status;
  response_queued_ = true;
  Enqueue(absl::StrCat(StatusLine(status), "Content-Type: ", r.content_type,
                       "\r\nContent-Length: ", r.body.size(), "\r\nConnection: close\r\n",
                       FormatHeaders(r.headers), "\r\n", r.body));
}

void Session::StartWatch() {
  if (watching_ || phase_ == Phase::kClosed) return;
  watching_ = true;
  // The raw socket, not the tcp_stream: this read must not be subject to the stream's timer.
  stream_.socket().async_read_some(
      net::buffer(scratch_), beast::bind_front_handler(&Session::OnWatch, shared_from_this()));
}

void Session::OnWatch(beast::error_code ec, size_t bytes) {
  watching_ = false;
  switch (phase_) {
    case Phase::kClosed:
      return;
    case Phase::kLingering:
      // The watch was cancelled (or finished) so that the drain can read.
      if (ec && ec != net::error::operation_aborted) return Close();
      return ReadLinger();
    case Phase::kReading:
    case Phase::kHandling:
      break;
  }
  if (bytes > 0) {  // a pipelined next request: keep it for the parser
    auto dst = buffer_.prepare(bytes);
    std::memcpy(dst.data(), scratch_.data(), bytes);
    buffer_.commit(bytes);
  }
  if (read_after_watch_) {
    read_after_watch_ = false;
    if (ec && ec != net::error::operation_aborted) return Close();
    return DoReadHeader();
  }
  if (ec) {
    // The client went away (EOF or reset). If the whole response is already being written,
    // let the write decide whether it was delivered; otherwise the client is gone now.
    if (response_queued_) {
      keep_alive_ = false;
      return;
    }
    return Close();
  }
  const auto& opts = server_->options();
  if (buffer_.size() < opts.max_header_bytes + opts.max_body_bytes) StartWatch();
}

void Session::Enqueue(std::string bytes) {
  writes_.push_back(std::move(bytes));
  DoWrite();
}

void Session::DoWrite() {
  if (writing_ || writes_.empty() || phase_ == Phase::kClosed) return;
  writing_ = true;
  stream_.expires_after(ToChrono(server_->options().write_timeout));
  net::async_write(stream_, net::buffer(writes_.front()),
                   beast::bind_front_handler(&Session::OnWrite, shared_from_this()));
}

void Session::OnWrite(beast::error_code ec, size_t /*bytes*/) {
  writing_ = false;
  if (phase_ == Phase::kClosed) return;
  if (ec) return Close();
  writes_.pop_front();
  if (!writes_.empty()) return DoWrite();
  if (response_queued_) FinishResponse();
}

void Session::FinishResponse() {
  on_close_ = nullptr;
  response_queued_ = false;
  response_done_ = true;
  if (!keep_alive_ || server_->stopping()) return StartLinger();
  phase_ = Phase::kReading;
  if (watching_) {
    read_after_watch_ = true;
    beast::error_code ignored;
    stream_.socket().cancel(ignored);
    return;
  }
  DoReadHeader();
}

void Session::StartLinger() {
  phase_ = Phase::kLingering;
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
  if (watching_) {
    stream_.socket().cancel(ignored);  // OnWatch continues with ReadLinger
    return;
  }
  ReadLinger();
}

void Session::ReadLinger() {
  stream_.expires_after(ToChrono(kLingerTimeout));
  stream_.async_read_some(net::buffer(scratch_),
                          [self = shared_from_this()](beast::error_code ec, size_t bytes) {
                            if (self->phase_ != Phase::kLingering) return;
                            self->linger_bytes_ += bytes;
                            if (ec || self->linger_bytes_ > kMaxLingerBytes) return self->Close();
                            self->ReadLinger();
                          });
}

void Session::Close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  if (registered_) server_->SessionClosed();
  beast::error_code ignored;
  stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
  stream_.close();
  writes_.clear();
  if (on_close_) {
    auto fn = std::move(on_close_);
    on_close_ = nullptr;
    fn();
  }
}

void Session::OnServerStopping() {
  switch (phase_) {
    case Phase::kReading:
      return Close();
    case Phase::kHandling:
      keep_alive_ = false;
      return;
    case Phase::kLingering:
    case Phase::kClosed:
      return;
  }
}

void Session::DoRespond(uint64_t seq, HttpResponse r) {
  if (seq != seq_ || phase_ != Phase::kHandling || response_started_) return;
  response_started_ = true;
  response_queued_ = true;
  Enqueue(absl::StrCat(StatusLine(r.status), "Content-Type: ", r.content_type,
                       "\r\nContent-Length: ", r.body.size(),
                       "\r\nConnection: ", keep_alive_ ? "keep-alive" : "close", "\r\n",
                       FormatHeaders(r.headers), "\r\n", r.body));
}

void Session::DoStartStream(uint64_t seq, int status, const std::string& content_type,
                            const HttpHeaders& headers) {
  if (seq != seq_ || phase_ != Phase::kHandling || response_started_) return;
  response_started_ = true;
  streaming_ = true;
  if (http10_) {
    // HTTP/1.0 has no chunked encoding: the body runs until the connection closes.
    keep_alive_ = false;
    Enqueue(absl::StrCat(StatusLine(status), "Content-Type: ", content_type,
                         "\r\nCache-Control: no-cache\r\nConnection: close\r\n",
                         FormatHeaders(headers), "\r\n"));
    return;
  }
  Enqueue(absl::StrCat(StatusLine(status), "Content-Type: ", content_type,
                       "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n",
                       "Connection: ", keep_alive_ ? "keep-alive" : "close", "\r\n",
                       FormatHeaders(headers), "\r\n"));
}

void Session::DoWriteChunk(uint64_t seq, const std::string& data) {
  if (seq != seq_ || phase_ != Phase::kHandling || !streaming_ || response_queued_) return;
  if (data.empty()) return;
  Enqueue(http10_ ? data : absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n"));
}

void Session::DoEndStream(uint64_t seq) {
  if (seq != seq_ || phase_ != Phase::kHandling || !streaming_ || response_queued_) return;
  response_queued_ = true;
  if (!http10_) return Enqueue("0\r\n\r\n");
  // Nothing terminates an HTTP/1.0 body but the close, once the writes are out.
  if (!writing_ && writes_.empty()) FinishResponse();
}

void Session::DoSetCloseHandler(uint64_t seq, std::function<void()> on_close) {
  if (seq != seq_) return;
  if (phase_ == Phase::kHandling) {
    on_close_ = std::move(on_close);
  } else if (phase_ == Phase::kClosed && !response_done_) {
    on_close();  // the connection ended before this request's response was written
  }
}

void Session::DoRelease(uint64_t seq) {
  if (seq != seq_ || phase_ != Phase::kHandling) return;
  if (!response_started_) {
    LOG(ERROR) << "http server: handler dropped a request without a response";
    HttpResponse r = server_->options().error_response(500, "internal error: no response");
    r.status = 500;
    DoRespond(seq, std::move(r));
  } else if (streaming_ && !response_queued_) {
    Close();
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              HttpHandler handler) {
  auto server = std::make_unique<HttpServerImpl>(std::move(options), std::move(handler));
  if (absl::Status s = server->Listen(); !s.ok()) return s;
  server->Run();
  return server;
}

}  // namespace tandem::router
