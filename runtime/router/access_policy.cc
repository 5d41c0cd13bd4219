#include "runtime/router/access_policy.h"

#include <fstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "runtime/base/secrets.h"

namespace tandem::router {
namespace {

// An IPv4 address in 127.0.0.0/8, written as four decimal parts (not a name that starts so:
// "127.0.0.1.evil.example" resolves wherever its owner wants).
bool IsLoopbackIpv4(absl::string_view host) {
  if (!absl::StartsWith(host, "127.")) return false;
  int dots = 0;
  for (char ch : host) {
    if (ch == '.') {
      ++dots;
    } else if (!absl::ascii_isdigit(static_cast<unsigned char>(ch))) {
      return false;
    }
  }
  return dots == 3;
}

bool IsLoopback(absl::string_view host) {
  return host == "localhost" || absl::EndsWith(host, ".localhost") || host == "[::1]" ||
         host == "::1" || IsLoopbackIpv4(host);
}

// "Host: name[:port]" -> name (lower case); "[v6]:port" -> "[v6]".
std::string HostName(absl::string_view header) {
  std::string host = absl::AsciiStrToLower(absl::StripAsciiWhitespace(header));
  if (absl::StartsWith(host, "[")) {
    const size_t close = host.find(']');
    return close == std::string::npos ? host : host.substr(0, close + 1);
  }
  const size_t colon = host.rfind(':');
  return colon == std::string::npos ? host : host.substr(0, colon);
}

}  // namespace

absl::StatusOr<AccessPolicy> AccessPolicy::Create(AccessOptions options) {
  for (const std::string& key : options.api_keys) {
    if (key.empty() || key.find_first_of(" \t\r\n") != std::string::npos) {
      return absl::InvalidArgumentError("--api-key: a key must be non-empty, without whitespace");
    }
  }
  bool any = false;
  for (std::string& host : options.allowed_hosts) {
    host = absl::AsciiStrToLower(host);
    if (host == "*") {
      any = true;
      continue;
    }
    if (host.empty() || (host.find(':') != std::string::npos && !absl::StartsWith(host, "["))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--allowed-host '", host, "': expected a host name or address without a port"));
    }
  }
  options.bind_host = absl::AsciiStrToLower(options.bind_host);
  AccessPolicy policy(std::move(options));
  // Bound to all or to a non-loopback address, with no list: any Host (the network decides).
  policy.any_host_ =
      any || (policy.options_.allowed_hosts.empty() && !IsLoopback(policy.options_.bind_host));
  return policy;
}

bool AccessPolicy::HostAllowed(absl::string_view host_header) const {
  if (any_host_) return true;
  const std::string host = HostName(host_header);
  if (host.empty()) return false;
  if (options_.allowed_hosts.empty()) return IsLoopback(host) || host == options_.bind_host;
  for (const std::string& allowed : options_.allowed_hosts) {
    if (host == allowed) return true;
  }
  return false;
}

std::optional<ApiError> AccessPolicy::Check(const HttpRequest& request) const {
  if (!HostAllowed(request.Header("Host"))) {
    return MakeApiError(
        421, absl::StrCat("this server does not answer for host '", request.Header("Host"), "'"));
  }
  if (authenticates() && (absl::StartsWith(request.path, "/v1/") || request.path == "/tokenize" ||
                          request.path == "/detokenize")) {
    const std::string auth = request.Header("Authorization");
    absl::string_view token = auth;
    bool matched = false;
    if (absl::ConsumePrefix(&token, "Bearer ")) {
      token = absl::StripAsciiWhitespace(token);
      for (const std::string& key : options_.api_keys) matched |= ConstantTimeEquals(token, key);
    }
    if (!matched) {
      return MakeApiError(401,
                          auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                       : "incorrect API key provided",
                          "", "invalid_api_key");
    }
  }
  if (request.method == "POST") {
    const std::string type = absl::AsciiStrToLower(request.Header("Content-Type"));
    absl::string_view media = type;
    media = media.substr(0, media.find(';'));
    if (absl::StripAsciiWhitespace(media) != "application/json") {
      return MakeApiError(415, absl::StrCat("Content-Type must be application/json, not '",
                                            request.Header("Content-Type"), "'"));
    }
  }
  return std::nullopt;
}

bool AccessPolicy::OriginAllowed(absl::string_view origin) const {
  if (origin.empty()) return false;
  for (const std::string& allowed : options_.cors_origins) {
    if (allowed == "*" || allowed == origin) return true;
  }
  return false;
}

std::optional<HttpResponse> AccessPolicy::Preflight(const HttpRequest& request) const {
  if (request.method != "OPTIONS" || request.Header("Access-Control-Request-Method").empty()) {
    return std::nullopt;
  }
  const std::string origin = request.Header("Origin");
  HttpResponse r;
  if (!HostAllowed(request.Header("Host"))) {
    r.status = 421;
    r.body = ErrorJson(MakeApiError(
        421, absl::StrCat("this server does not answer for host '", request.Header("Host"), "'")));
    return r;
  }
  if (!OriginAllowed(origin)) {
    r.status = 403;
    r.body = ErrorJson(MakeApiError(
        403, absl::StrCat("cross-origin requests from '", origin, "' are not allowed")));
    return r;
  }
  r.status = 204;
  r.content_type = "text/plain";
  r.headers = {{"Access-Control-Allow-Origin", origin},
               {"Vary", "Origin"},
               {"Access-Control-Allow-Methods", "GET, POST, OPTIONS"},
               {"Access-Control-Allow-Headers", "Authorization, Content-Type"},
               {"Access-Control-Max-Age", "600"}};
  return r;
}

HttpHeaders AccessPolicy::ResponseHeaders(const HttpRequest& request) const {
  const std::string origin = request.Header("Origin");
  if (!OriginAllowed(origin)) return {};
  return {{"Access-Control-Allow-Origin", origin}, {"Vary", "Origin"}};
}

absl::StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("--api-key-file: cannot read ", path));
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    const absl::string_view key = absl::StripAsciiWhitespace(line);
    if (key.empty() || absl::StartsWith(key, "#")) continue;
    keys.emplace_back(key);
  }
  if (keys.empty())
    return absl::InvalidArgumentError(absl::StrCat("--api-key-file: no key in ", path));
  return keys;
}

}  // namespace tandem::router
