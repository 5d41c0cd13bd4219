#pragma once
// Who may use the router's HTTP API, checked before a request is routed:
// - Host: the Host header must name this server. A router bound to a loopback address accepts
//   only loopback names (localhost, 127.0.0.1, [::1]) and the bound address, at any port, unless
//   `allowed_hosts` says otherwise, so a web page cannot reach it through DNS rebinding. A router
//   bound to another address accepts any Host unless `allowed_hosts` is set. "*" accepts any.
//   Anything else: 421 (misdirected request).
// - API keys: with `api_keys` set, every /v1/ route (and /tokenize, /detokenize) needs
//   `Authorization: Bearer <key>` naming
//   one of them (compared in constant time): 401 with `invalid_api_key` otherwise. /health and
//   /metrics stay open (probes and scrapers; put them behind the network instead).
// - Content-Type: a POST must carry `application/json` (parameters such as charset allowed):
//   415 otherwise, so a browser's simple cross-site form post is refused.
// - CORS (off unless `cors_origins` is set): a request whose Origin is listed ("*": any) gets
//   Access-Control-Allow-Origin and Vary: Origin on its response; a preflight (OPTIONS with
//   Access-Control-Request-Method) from a listed origin is answered 204 with the methods and
//   headers allowed, before any API key is asked for (browsers send none); from another origin,
//   403. Without the list no CORS header is sent, so browsers keep cross-origin pages out.
// Errors are OpenAI-style bodies (openai_protocol.h).
//
// Thread-safety: immutable after construction; Check may be called from any thread.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/router/http_server.h"
#include "runtime/router/openai_protocol.h"

namespace tandem::router {

struct AccessOptions {
  std::vector<std::string> api_keys = {};       // empty: no authentication
  std::vector<std::string> allowed_hosts = {};  // host names or addresses, no port; "*": any
  std::string bind_host = "";                   // the address the server is bound to
  std::vector<std::string> cors_origins = {};   // e.g. "https://app.example"; "*": any
};

class AccessPolicy {
 public:
  // InvalidArgument for an empty or whitespace-bearing key, or an allowed host with a port.
  static absl::StatusOr<AccessPolicy> Create(AccessOptions options);

  // The error to answer instead of serving `request`, or nullopt when it may proceed.
  std::optional<ApiError> Check(const HttpRequest& request) const;
  // A CORS preflight (OPTIONS with Access-Control-Request-Method): its complete answer (204 or
  // 403). Nullopt for any other request.
  std::optional<HttpResponse> Preflight(const HttpRequest& request) const;
  // Headers to add to the response of `request` (CORS for a listed Origin); empty otherwise.
  HttpHeaders ResponseHeaders(const HttpRequest& request) const;

  bool authenticates() const { return !options_.api_keys.empty(); }

 private:
  explicit AccessPolicy(AccessOptions options) : options_(std::move(options)) {}
  bool HostAllowed(absl::string_view host_header) const;
  bool OriginAllowed(absl::string_view origin) const;

  AccessOptions options_;
  bool any_host_ = false;
};

// Reads API keys from a file: one per line; blank lines and lines starting with '#' are skipped.
absl::StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::string& path);

}  // namespace tandem::router
