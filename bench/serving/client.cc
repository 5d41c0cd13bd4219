#include "bench/serving/client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "bench/serving/sse_parser.h"
#include "boost/asio.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "nlohmann/json.hpp"

namespace tandem::bench {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
using boost::system::error_code;

constexpr size_t kBodyChunkBytes = 8192;
constexpr size_t kErrorBodyKeep = 512;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool IsResetError(const error_code& ec) {
  return ec == asio::error::eof || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted ||
         ec == http::error::end_of_stream || ec == http::error::partial_message;
}

ErrorKind ClassifyReadError(const error_code& ec) {
  if (IsResetError(ec)) return ErrorKind::kReset;
  if (ec.category() == make_error_code(http::error::end_of_stream).category()) {
    return ErrorKind::kMalformed;
  }
  return ErrorKind::kReset;
}

// One keep-alive connection; reused by consecutive requests.
struct Connection {
  explicit Connection(asio::io_context& io) : socket(io) {}
  tcp::socket socket;
  beast::flat_buffer buffer;
};

class Engine;

// One request from send to end of stream. Lives as long as a handler holds it.
class RequestOp : public std::enable_shared_from_this<RequestOp> {
 public:
  RequestOp(Engine& engine, size_t record, std::string wire, bool chat, int expected_input);
  void Start();
  void Cancel();

 private:
  enum class State { kActive, kDraining, kClosed };

  void NewConnection();
  void Write();
  void ReadHeader();
  void ReadBody();
  void OnBody(size_t n);
  void OnMessageEnd();
  bool OnEvent(std::string_view data);
  void Finish(ErrorKind kind, std::string message);
  void Close();
  void Release();  // keep-alive connection back to the pool
  bool CanRetry(const error_code& ec) const {
    return reused_ && !retried_ && !got_header_ && IsResetError(ec);
  }
  void Retry();

  Engine& engine_;
  size_t record_;
  std::string wire_;
  bool chat_;
  int expected_input_;
  std::shared_ptr<Connection> conn_;
  bool reused_ = false;
  bool retried_ = false;
  bool got_header_ = false;
  bool event_stream_ = false;
  int status_ = 0;
  std::optional<http::response_parser<http::buffer_body>> parser_;
  std::unique_ptr<char[]> body_buf_;
  std::string error_body_;
  SseParser sse_;
  asio::steady_timer deadline_;
  Clock::time_point start_;
  Clock::time_point last_chunk_;
  bool got_chunk_ = false;
  bool got_done_ = false;
  ErrorKind pending_error_ = ErrorKind::kNone;
  std::string pending_message_;
  std::vector<double> itls_;
  double ttft_ = 0;
  int chunks_ = 0;
  std::optional<int> usage_prompt_, usage_completion_;
  State state_ = State::kActive;
};

class Engine {
 public:
  Engine(const LoadOptions& options, const std::vector<WorkItem>& items,
         const std::atomic<bool>* stop, const std::function<void(const Progress&)>& on_progress)
      : options_(options),
        items_(items),
        stop_(stop),
        on_progress_(on_progress),
        burst_(std::isinf(options.request_rate)),
        schedule_(options.request_rate, options.arrival, options.seed + 1),
        arrival_timer_(io_),
        poll_timer_(io_) {}

  absl::StatusOr<LoadResult> Run() {
    if (absl::Status s = ParseTarget(); !s.ok()) return s;
    error_code ec;
    tcp::resolver resolver(io_);
    endpoints_ = resolver.resolve(url_.host, url_.port, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot resolve ", url_.host, ":", url_.port, ": ", ec.message()));
    }
    path_ = url_.base_path +
            (options_.endpoint == ApiEndpoint::kChat ? "/chat/completions" : "/completions");
    host_header_ = absl::StrCat(url_.host, ":", url_.port);
    t0_ = Clock::now();
    last_end_ = t0_;
    next_arrival_ = schedule_.Next();
    asio::post(io_, [this] { OnArrivals(); });
    Poll();
    io_.run();
    LoadResult result;
    result.records = std::move(records_);
    result.duration_s = Seconds(last_end_ - t0_);
    result.max_concurrent = max_concurrent_;
    result.interrupted = interrupted_;
    return result;
  }

  // Called by RequestOp.
  asio::io_context& io() { return io_; }
  const tcp::resolver::results_type& endpoints() const { return endpoints_; }
  RequestRecord& record(size_t i) { return records_[i]; }
  double request_timeout_s() const { return options_.request_timeout_s; }
  Clock::time_point t0() const { return t0_; }
  std::shared_ptr<Connection> TakeIdle() {
    if (idle_.empty()) return nullptr;
    std::shared_ptr<Connection> c = std::move(idle_.back());
    idle_.pop_back();
    return c;
  }
  void PutIdle(std::shared_ptr<Connection> c) {
    if (!done_) idle_.push_back(std::move(c));
  }
  void OnFinished(RequestOp* op, ErrorKind error) {
    active_.erase(op);
    --in_flight_;
    ++finished_;
    if (error != ErrorKind::kNone && error != ErrorKind::kCancelled) ++failed_;
    last_end_ = std::max(last_end_, Clock::now());
    if (burst_ && !arrivals_done_) {
      OnArrivals();
    } else {
      Dispatch();
    }
    MaybeDone();
  }

 private:
  absl::Status ParseTarget() {
    absl::StatusOr<ParsedUrl> u = ParseUrl(options_.url);
    if (!u.ok()) return u.status();
    url_ = *u;
    return absl::OkStatus();
  }
  double Elapsed() const { return Seconds(Clock::now() - t0_); }

  bool CountLimitReached() const {
    return options_.num_requests > 0 && due_ >= options_.num_requests;
  }

  bool ArrivalsOver() const {
    if (CountLimitReached()) return true;
    if (!(options_.duration_s > 0)) return false;
    // A burst is a closed loop refilled as requests finish: it ends by the clock.
    if (burst_) return Elapsed() >= options_.duration_s;
    return next_arrival_ >= options_.duration_s;
  }

  // Moves requests whose send time has come to `pending_` and sends what concurrency allows.
  void OnArrivals() {
    if (arrivals_done_) return;
    const double now = Elapsed();
    while (!ArrivalsOver() && next_arrival_ <= now) {
      if (burst_ && options_.max_concurrency > 0 &&
          in_flight_ + static_cast<int>(pending_.size()) >= options_.max_concurrency) {
        break;  // refilled from OnFinished
      }
      pending_.push_back(due_++);
      next_arrival_ = schedule_.Next();
    }
    Dispatch();
    if (ArrivalsOver()) {
      arrivals_done_ = true;
      MaybeDone();
      return;
    }
    if (burst_) return;
    arrival_timer_.expires_at(t0_ + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(next_arrival_)));
    arrival_timer_.async_wait([this](const error_code& ec) {
      if (!ec) OnArrivals();
    });
  }

  void Dispatch() {
    while (!pending_.empty() && !done_ &&
           (options_.max_concurrency <= 0 || in_flight_ < options_.max_concurrency)) {
      const size_t item_index = pending_.front() % items_.size();
      pending_.pop_front();
      const WorkItem& item = items_[item_index];
      const size_t rec = records_.size();
      records_.emplace_back();
      records_.back().start_s = Elapsed();
      std::string body = RequestBody(options_, item);
      std::string wire = absl::StrCat("POST ", path_, " HTTP/1.1\r\nHost: ", host_header_,
                                      "\r\nContent-Type: application/json\r\n"
                                      "Accept: text/event-stream\r\nContent-Length: ",
                                      body.size(), "\r\n");
      if (!options_.api_key.empty()) {
        absl::StrAppend(&wire, "Authorization: Bearer ", options_.api_key, "\r\n");
      }
      absl::StrAppend(&wire, "\r\n", body);
      auto op = std::make_shared<RequestOp>(
          *this, rec, std::move(wire), options_.endpoint == ApiEndpoint::kChat, item.input_len);
      active_.emplace(op.get(), op);
      ++in_flight_;
      ++sent_;
      max_concurrent_ = std::max(max_concurrent_, in_flight_);
      op->Start();
    }
  }

  void MaybeDone() {
    if (done_ || !arrivals_done_ || !pending_.empty() || in_flight_ > 0) return;
    done_ = true;
    ReportProgress();
    arrival_timer_.cancel();
    poll_timer_.cancel();
    for (auto& c : idle_) {
      error_code ignored;
      c->socket.close(ignored);
    }
    idle_.clear();
    io_.stop();
  }

  void Poll() {
    if (done_) return;
    if (stop_ != nullptr && stop_->load() && !interrupted_) {
      interrupted_ = true;
      arrivals_done_ = true;
      pending_.clear();
      std::vector<std::shared_ptr<RequestOp>> ops;
      for (auto& [ptr, weak] : active_) {
        if (auto op = weak.lock()) ops.push_back(std::move(op));
      }
      for (auto& op : ops) op->Cancel();
      last_end_ = Clock::now();
      MaybeDone();
      if (done_) return;
    }
    if (burst_ && !arrivals_done_ && ArrivalsOver()) {
      arrivals_done_ = true;
      MaybeDone();
      if (done_) return;
    }
    if (options_.duration_s > 0 && Elapsed() >= options_.duration_s && !pending_.empty()) {
      // Time is up for requests still waiting for a concurrency slot. Arrivals scheduled before
      // the end are still sent (OnArrivals decides by schedule time, not by timer lateness).
      pending_.clear();
      MaybeDone();
      if (done_) return;
    }
    if (++polls_ % 2 == 0) ReportProgress();
    poll_timer_.expires_after(std::chrono::milliseconds(50));
    poll_timer_.async_wait([this](const error_code& ec) {
      if (!ec) Poll();
    });
  }

  void ReportProgress() {
    if (!on_progress_) return;
    Progress p;
    p.sent = sent_;
    p.finished = finished_;
    p.failed = failed_;
    p.in_flight = in_flight_;
    p.total = options_.num_requests;
    p.elapsed_s = Elapsed();
    p.duration_s = options_.duration_s;
    on_progress_(p);
  }

  const LoadOptions& options_;
  const std::vector<WorkItem>& items_;
  const std::atomic<bool>* stop_;
  const std::function<void(const Progress&)>& on_progress_;
  asio::io_context io_{1};
  ParsedUrl url_;
  std::string path_;
  std::string host_header_;
  tcp::resolver::results_type endpoints_;
  const bool burst_;  // infinite request rate
  ArrivalSchedule schedule_;
  asio::steady_timer arrival_timer_;
  asio::steady_timer poll_timer_;
  Clock::time_point t0_;
  Clock::time_point last_end_;
  double next_arrival_ = 0;
  int due_ = 0;
  std::deque<int> pending_;
  std::vector<RequestRecord> records_;
  std::vector<std::shared_ptr<Connection>> idle_;
  std::unordered_map<RequestOp*, std::weak_ptr<RequestOp>> active_;
  int in_flight_ = 0;
  int sent_ = 0;
  int finished_ = 0;
  int failed_ = 0;
  int max_concurrent_ = 0;
  int polls_ = 0;
  bool arrivals_done_ = false;
  bool interrupted_ = false;
  bool done_ = false;
};

RequestOp::RequestOp(Engine& engine, size_t record, std::string wire, bool chat, int expected_input)
    : engine_(engine),
      record_(record),
      wire_(std::move(wire)),
      chat_(chat),
      expected_input_(expected_input),
      deadline_(engine.io()) {}

void RequestOp::Start() {
  start_ = Clock::now();
  deadline_.expires_at(start_ + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(engine_.request_timeout_s())));
  deadline_.async_wait([self = shared_from_this()](const error_code& ec) {
    if (ec) return;
    if (self->state_ == State::kActive) {
      self->Finish(ErrorKind::kTimeout, absl::StrCat("no complete response within ",
                                                     self->engine_.request_timeout_s(), " s"));
    } else {
      self->Close();
    }
  });
  conn_ = engine_.TakeIdle();
  if (conn_ != nullptr) {
    reused_ = true;
    Write();
  } else {
    NewConnection();
  }
}

void RequestOp::Cancel() {
  if (state_ == State::kActive) Finish(ErrorKind::kCancelled, "interrupted");
}

void RequestOp::NewConnection() {
  conn_ = std::make_shared<Connection>(engine_.io());
  asio::async_connect(
      conn_->socket, engine_.endpoints(),
      [self = shared_from_this(), conn = conn_](const error_code& ec, const tcp::endpoint&) {
        if (self->state_ != State::kActive || conn != self->conn_) return;
        if (ec) {
          self->Finish(ErrorKind::kConnect, ec.message());
          return;
        }
        error_code ignored;
        conn->socket.set_option(tcp::no_delay(true), ignored);
        self->Write();
      });
}

void RequestOp::Retry() {
  retried_ = true;
  reused_ = false;
  error_code ignored;
  conn_->socket.close(ignored);
  NewConnection();
}

void RequestOp::Write() {
  asio::async_write(conn_->socket, asio::buffer(wire_),
                    [self = shared_from_this(), conn = conn_](const error_code& ec, size_t) {
                      if (self->state_ != State::kActive || conn != self->conn_) return;
                      if (ec) {
                        if (self->CanRetry(ec)) return self->Retry();
                        self->Finish(ErrorKind::kReset, absl::StrCat("send: ", ec.message()));
                        return;
                      }
                      self->ReadHeader();
                    });
}

void RequestOp::ReadHeader() {
  parser_.emplace();
  // Boost 1.74 compares Content-Length against an empty optional as "over the limit": use a number.
  parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
  http::async_read_header(
      conn_->socket, conn_->buffer, *parser_,
      [self = shared_from_this(), conn = conn_](const error_code& ec, size_t) {
        if (self->state_ != State::kActive || conn != self->conn_) return;
        if (ec) {
          if (self->CanRetry(ec)) return self->Retry();
          self->Finish(ClassifyReadError(ec), absl::StrCat("reading headers: ", ec.message()));
          return;
        }
        self->got_header_ = true;
        const auto& res = self->parser_->get();
        self->status_ = res.result_int();
        self->engine_.record(self->record_).http_status = self->status_;
        self->event_stream_ =
            absl::StrContains(absl::string_view(res[http::field::content_type].data(),
                                                res[http::field::content_type].size()),
                              "text/event-stream");
        self->body_buf_ = std::make_unique<char[]>(kBodyChunkBytes);
        if (self->parser_->is_done()) return self->OnMessageEnd();
        self->ReadBody();
      });
}

void RequestOp::ReadBody() {
  auto& body = parser_->get().body();
  body.data = body_buf_.get();
  body.size = kBodyChunkBytes;
  http::async_read_some(conn_->socket, conn_->buffer, *parser_,
                        [self = shared_from_this(), conn = conn_](error_code ec, size_t) {
                          if (self->state_ == State::kClosed || conn != self->conn_) return;
                          if (ec == http::error::need_buffer) ec = {};
                          const size_t n = kBodyChunkBytes - self->parser_->get().body().size;
                          if (ec) {
                            if (self->state_ == State::kDraining) return self->Close();
                            if (n > 0) self->OnBody(n);
                            if (self->state_ != State::kActive) return;
                            self->Finish(ClassifyReadError(ec),
                                         absl::StrCat("reading body: ", ec.message()));
                            return;
                          }
                          if (n > 0) self->OnBody(n);
                          if (self->state_ == State::kClosed) return;
                          if (self->parser_->is_done()) return self->OnMessageEnd();
                          self->ReadBody();
                        });
}

void RequestOp::OnBody(size_t n) {
  if (state_ != State::kActive) return;  // draining: bytes after [DONE] are ignored
  std::string_view bytes(body_buf_.get(), n);
  if (status_ != 200 || !event_stream_) {
    if (error_body_.size() < kErrorBodyKeep) {
      error_body_.append(bytes.substr(0, kErrorBodyKeep - error_body_.size()));
    }
    return;
  }
  const bool ok = sse_.Feed(bytes, [this](std::string_view data) { return OnEvent(data); });
  if (pending_error_ != ErrorKind::kNone) {
    Finish(pending_error_, std::move(pending_message_));
    return;
  }
  if (!ok) {
    Finish(ErrorKind::kMalformed, "SSE line too long");
    return;
  }
  if (got_done_) Finish(ErrorKind::kNone, "");
}

bool RequestOp::OnEvent(std::string_view data) {
  if (got_done_) return false;
  if (data == "[DONE]") {
    got_done_ = true;
    return false;
  }
  json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    pending_error_ = ErrorKind::kMalformed;
    pending_message_ = absl::StrCat("invalid JSON event: ", std::string(data.substr(0, 200)));
    return false;
  }
  if (auto e = j.find("error"); e != j.end() && !e->is_null()) {
    pending_error_ = ErrorKind::kStreamError;
    std::string msg = e->dump();
    if (e->is_object() && e->contains("message") && (*e)["message"].is_string()) {
      msg = (*e)["message"].get<std::string>();
    }
    pending_message_ = msg.substr(0, 300);
    return false;
  }
  if (auto c = j.find("choices"); c != j.end() && c->is_array() && !c->empty()) {
    const json& choice = (*c)[0];
    const json* text = nullptr;
    if (chat_) {
      if (auto d = choice.find("delta"); d != choice.end() && d->is_object()) {
        if (auto t = d->find("content"); t != d->end()) text = &*t;
      }
    } else if (auto t = choice.find("text"); t != choice.end()) {
      text = &*t;
    }
    // A token-bearing event: a content/text delta (possibly empty: tokens that decode to no text
    // yet still arrive as events) that is not the closing finish_reason event.
    const auto fr = choice.find("finish_reason");
    const bool closing = fr != choice.end() && !fr->is_null();
    const bool role_only = chat_ && text != nullptr && text->is_string() &&
                           text->get_ref<const std::string&>().empty() &&
                           choice.contains("delta") && choice["delta"].contains("role");
    if (text != nullptr && text->is_string() && !closing && !role_only) {
      const Clock::time_point now = Clock::now();
      if (!got_chunk_) {
        ttft_ = Seconds(now - start_);
        got_chunk_ = true;
      } else {
        itls_.push_back(Seconds(now - last_chunk_));
      }
      last_chunk_ = now;
      ++chunks_;
    }
  }
  if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
    auto pt = u->find("prompt_tokens");
    auto ct = u->find("completion_tokens");
    if (pt != u->end() && pt->is_number_integer()) usage_prompt_ = pt->get<int>();
    if (ct != u->end() && ct->is_number_integer()) usage_completion_ = ct->get<int>();
  }
  return true;
}

void RequestOp::OnMessageEnd() {
  if (state_ == State::kDraining) return Release();
  if (state_ != State::kActive) return;
  if (status_ != 200) {
    const int status = status_;
    std::string body = std::move(error_body_);
    Finish(ErrorKind::kHttpStatus, absl::StrCat("HTTP ", status, ": ", body));
    if (parser_->keep_alive()) Release();
    return;
  }
  if (!event_stream_) {
    Finish(ErrorKind::kMalformed,
           absl::StrCat("200 response is not an event stream: ", error_body_.substr(0, 200)));
    return;
  }
  Finish(ErrorKind::kTruncated, "stream ended without data: [DONE]");
}

void RequestOp::Finish(ErrorKind kind, std::string message) {
  if (state_ != State::kActive) return;
  RequestRecord& r = engine_.record(record_);
  r.e2e_s = Seconds(Clock::now() - start_);
  r.ttft_s = ttft_;
  r.itls_s = std::move(itls_);
  r.usage_reported = usage_completion_.has_value();
  r.prompt_tokens = usage_prompt_.value_or(std::max(expected_input_, 0));
  r.completion_tokens = usage_completion_.value_or(chunks_);
  r.error = kind;
  r.error_message = std::move(message);
  // OnFinished may start requests (and grow the record vector): `r` is not used after it.
  if (kind == ErrorKind::kNone) {
    // Read to the end of the HTTP message so the connection can be reused.
    state_ = State::kDraining;
    engine_.OnFinished(this, kind);
    if (parser_->is_done()) Release();
    return;
  }
  engine_.OnFinished(this, kind);
  Close();
}

void RequestOp::Close() {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  deadline_.cancel();
  if (conn_ != nullptr) {
    error_code ignored;
    conn_->socket.close(ignored);
  }
}

void RequestOp::Release() {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  deadline_.cancel();
  if (conn_ != nullptr && parser_ && parser_->keep_alive() && conn_->buffer.size() == 0) {
    engine_.PutIdle(std::move(conn_));
  } else if (conn_ != nullptr) {
    error_code ignored;
    conn_->socket.close(ignored);
  }
  conn_ = nullptr;
}

}  // namespace

absl::StatusOr<ParsedUrl> ParseUrl(const std::string& url) {
  absl::string_view rest = url;
  if (absl::StartsWith(rest, "https://")) {
    return absl::InvalidArgumentError("https URLs are not supported; use http://");
  }
  if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(absl::StrCat("expected http://HOST:PORT/PATH, got ", url));
  }
  ParsedUrl out;
  const size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  absl::string_view path = slash == absl::string_view::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  out.base_path = std::string(path);
  if (!authority.empty() && authority[0] == '[') {  // [v6]:port
    const size_t close = authority.find(']');
    if (close == absl::string_view::npos) return absl::InvalidArgumentError("bad IPv6 host");
    out.host = std::string(authority.substr(1, close - 1));
    authority.remove_prefix(close + 1);
    out.port = absl::ConsumePrefix(&authority, ":") ? std::string(authority) : "80";
  } else {
    const size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    out.port = colon == absl::string_view::npos ? "80" : std::string(authority.substr(colon + 1));
  }
  int port = 0;
  if (out.host.empty() || !absl::SimpleAtoi(out.port, &port) || port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("expected http://HOST:PORT/PATH, got ", url));
  }
  return out;
}

std::string RequestBody(const LoadOptions& options, const WorkItem& item) {
  json j;
  j["model"] = options.model;
  if (options.endpoint == ApiEndpoint::kChat) {
    j["messages"] = json::array({json{{"role", "user"}, {"content", item.prompt}}});
  } else {
    j["prompt"] = item.prompt;
  }
  j["max_tokens"] = item.output_len;
  j["temperature"] = options.temperature;
  j["stream"] = true;
  j["stream_options"] = {{"include_usage", true}};
  if (options.ignore_eos) j["ignore_eos"] = true;
  if (!options.extra_body.empty()) {
    // Checked by RunLoad before anything is sent.
    const json extra = json::parse(options.extra_body, nullptr, /*allow_exceptions=*/false);
    if (extra.is_object()) j.update(extra);
  }
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

absl::StatusOr<LoadResult> RunLoad(const LoadOptions& options, const std::vector<WorkItem>& items,
                                   const std::atomic<bool>* stop,
                                   const std::function<void(const Progress&)>& on_progress) {
  if (items.empty()) return absl::InvalidArgumentError("no requests to send");
  if (!options.extra_body.empty()) {
    const json extra = json::parse(options.extra_body, nullptr, /*allow_exceptions=*/false);
    if (extra.is_discarded() || !extra.is_object()) {
      return absl::InvalidArgumentError("--extra-body must be a JSON object");
    }
  }
  if (!(options.request_rate > 0)) return absl::InvalidArgumentError("request rate must be > 0");
  if (!(options.request_timeout_s > 0)) {
    return absl::InvalidArgumentError("request timeout must be > 0");
  }
  if (options.num_requests <= 0 && !(options.duration_s > 0)) {
    return absl::InvalidArgumentError("need a request count or a duration");
  }
  if (options.num_requests <= 0 && std::isinf(options.request_rate) &&
      options.max_concurrency <= 0) {
    return absl::InvalidArgumentError(
        "a burst (request rate inf) bounded only by --duration needs --max-concurrency");
  }
  Engine engine(options, items, stop, on_progress);
  return engine.Run();
}

absl::StatusOr<std::string> HttpGet(const std::string& host, const std::string& port,
                                    const std::string& path, double timeout_s,
                                    const std::string& api_key) {
  asio::io_context io;
  tcp::resolver resolver(io);
  beast::tcp_stream stream(io);
  beast::flat_buffer buffer;
  http::request<http::empty_body> req{http::verb::get, path, 11};
  req.set(http::field::host, host + ":" + port);
  if (!api_key.empty()) req.set(http::field::authorization, "Bearer " + api_key);
  http::response<http::string_body> res;
  absl::Status status = absl::DeadlineExceededError(
      absl::StrCat("GET http://", host, ":", port, path, ": no response within ", timeout_s, " s"));
  auto fail = [&](absl::string_view what, const error_code& ec) {
    status = absl::UnavailableError(
        absl::StrCat("GET http://", host, ":", port, path, ": ", what, ": ", ec.message()));
  };
  resolver.async_resolve(
      host, port, [&](const error_code& ec, const tcp::resolver::results_type& results) {
        if (ec) return fail("resolve", ec);
        stream.async_connect(results, [&](const error_code& ec, const tcp::endpoint&) {
          if (ec) return fail("connect", ec);
          http::async_write(stream, req, [&](const error_code& ec, size_t) {
            if (ec) return fail("send", ec);
            http::async_read(stream, buffer, res, [&](const error_code& ec, size_t) {
              if (ec) return fail("read", ec);
              if (res.result_int() != 200) {
                status = absl::UnavailableError(
                    absl::StrCat("GET ", path, ": HTTP ", res.result_int(), ": ", res.body()));
                return;
              }
              status = absl::OkStatus();
            });
          });
        });
      });
  io.run_for(std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(timeout_s)));
  if (!status.ok()) return status;
  return std::move(res.body());
}

absl::StatusOr<std::string> FetchFirstModel(const std::string& url, const std::string& api_key,
                                            double timeout_s) {
  absl::StatusOr<ParsedUrl> u = ParseUrl(url);
  if (!u.ok()) return u.status();
  absl::StatusOr<std::string> body =
      HttpGet(u->host, u->port, u->base_path + "/models", timeout_s, api_key);
  if (!body.ok()) return body.status();
  json j = json::parse(*body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("data") || !j["data"].is_array() ||
      j["data"].empty() || !j["data"][0].is_object() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return absl::UnavailableError(absl::StrCat("GET ", url, "/models: no model listed"));
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace tandem::bench
