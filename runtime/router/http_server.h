#pragma once
// A small asynchronous HTTP/1.1 server (Boost.Beast/Asio, kept private to http_server.cc) for the
// router's OpenAI frontend: N io threads, keep-alive, a request body limit (413 above it, before
// the body is read), idle/read/write timeouts, chunked streaming responses flushed per chunk, and
// prompt notice of a client that goes away while its response is pending (the socket is watched
// for EOF/reset while the handler works, and a failed write counts too; so a client that
// half-closes its sending side after the request counts as gone, as in most HTTP servers).
//
// Ownership and threads:
// - The handler runs on an io thread, one request per connection at a time (a pipelined next
//   request is read after the current response completes). It must not block: it answers through
//   the HttpExchange, from any thread, now or later.
// - HttpExchange methods are thread-safe and never block; calls are applied in the order they
//   were made (per exchange). After the connection closed, or after the server stopped, they do
//   nothing. An exchange dropped without a complete response answers 500, so a request is never
//   silently left hanging.
// - Stop() (also run by the destructor): stops accepting, closes idle connections, lets pending
//   responses finish for up to `shutdown_grace`, then closes the rest (their close handlers run,
//   so in-flight work can be cancelled) and joins the io threads. Exchanges may outlive the
//   server; they are then inert.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tandem::router {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

struct HttpRequest {
  std::string method;  // "GET", "POST", ... as sent
  std::string target;  // as sent: path plus optional query
  std::string path;    // target without the query
  HttpHeaders headers;
  std::string body;

  // Value of the first header named `name` (case-insensitive); "" when absent.
  std::string Header(absl::string_view name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  HttpHeaders headers;  // extra headers (no Content-Length/Connection: the server sets those)
  std::string body;
};

// The response side of one request. See the thread-safety notes above.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  // A complete response. Only the first of Respond/StartStream takes effect.
  virtual void Respond(HttpResponse response) = 0;
  // Starts a chunked (Transfer-Encoding: chunked) response; `content_type` e.g.
  // "text/event-stream". Then any number of WriteChunk, then EndStream. To an HTTP/1.0 client
  // the body is sent as is and ends when the server closes the connection.
  virtual void StartStream(int status, std::string content_type, HttpHeaders headers) = 0;
  // One HTTP chunk, written as soon as the previous writes are done. Empty data is skipped.
  virtual void WriteChunk(std::string data) = 0;
  // The terminating zero-length chunk; the response is complete once it is written.
  virtual void EndStream() = 0;
  // `on_close` runs once, on an io thread, if the connection ends before the response was
  // completely written (client EOF or reset, failed or timed-out write, server stop). Runs at
  // once if that already happened. Never runs after a complete response.
  virtual void SetCloseHandler(std::function<void()> on_close) = 0;
};

using HttpHandler =
    std::function<void(HttpRequest request, std::shared_ptr<HttpExchange> exchange)>;

struct HttpServerOptions {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the OS picks a free port (see HttpServer::port())
  int num_threads = 4;
  size_t max_body_bytes = 4 << 20;  // larger bodies get 413 without being read
  size_t max_header_bytes = 64 << 10;
  // Keep-alive wait plus reading the header (`tandem router --http-idle-timeout-s`). Behind a
  // proxy it must exceed the proxy's idle timeout (AWS ALB 60 s, GCP load balancers 600 s), so
  // the proxy, not the router, closes an idle connection: a router that closes first races the
  // proxy's next request on it, a reset the client sees. Facing clients directly, it also bounds
  // how long a slow header may hold a connection, hence the modest default.
  absl::Duration idle_timeout = absl::Seconds(75);
  absl::Duration read_timeout = absl::Seconds(60);   // reading the body once the header is in
  absl::Duration write_timeout = absl::Seconds(60);  // each write (a client not reading)
  absl::Duration shutdown_grace = absl::Seconds(5);  // Stop(): pending responses may finish
  // Body of the responses the server itself produces (400 malformed request, 413 too large).
  // Default: a plain-text message.
  std::function<HttpResponse(int status, const std::string& message)> error_response;
};

class HttpServer {
 public:
  // Binds and listens (errors: bad host, port in use), then starts the io threads.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           HttpHandler handler);
  virtual ~HttpServer() = default;

  virtual int port() const = 0;  // the bound port
  // Idempotent; blocks until the io threads are joined (so never call it from a handler).
  virtual void Stop() = 0;
};

}  // namespace tandem::router
