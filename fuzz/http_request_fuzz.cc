// The router's HTTP edge, from raw bytes: Boost.Beast's request parser with the server's limits
// (runtime/router/http_server.cc reads requests so), the request as the server hands it to the
// frontend, the access policy (Host, API key, Content-Type, CORS preflight and response headers),
// and for the OpenAI routes the request decoding and the prompt the frontend would build.
//
// Input: one byte choosing the access policy (its low two bits), then the bytes of one request as
// a client sends them. Properties: no crash; an allowed CORS Origin echoed into a response header
// never carries CR, LF or NUL; decoded prompts hold only vocabulary ids.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "fuzz/frontend_prompt.h"
#include "fuzz/fuzz_support.h"
#include "runtime/router/access_policy.h"
#include "runtime/router/http_server.h"
#include "runtime/router/openai_protocol.h"

namespace {

namespace http = boost::beast::http;
using tandem::router::AccessOptions;
using tandem::router::AccessPolicy;
using tandem::router::HttpRequest;

// The four policies a router runs with: open on loopback, keys and CORS, an allow list, and
// bound to all addresses with a wildcard origin.
const std::array<AccessPolicy, 4>& Policies() {
  static const auto* policies = [] {
    auto make = [](AccessOptions o) {
      absl::StatusOr<AccessPolicy> p = AccessPolicy::Create(std::move(o));
      if (!p.ok()) std::abort();
      return *std::move(p);
    };
    return new std::array<AccessPolicy, 4>{
        make({.api_keys = {}, .allowed_hosts = {}, .bind_host = "127.0.0.1", .cors_origins = {}}),
        make({.api_keys = {"sk-test-key", "second-key"},
              .allowed_hosts = {},
              .bind_host = "127.0.0.1",
              .cors_origins = {"https://app.example"}}),
        make({.api_keys = {"k"},
              .allowed_hosts = {"router.internal", "[::1]"},
              .bind_host = "10.0.0.5",
              .cors_origins = {}}),
        make({.api_keys = {}, .allowed_hosts = {}, .bind_host = "0.0.0.0", .cors_origins = {"*"}}),
    };
  }();
  return *policies;
}

bool SafeHeaderValue(absl::string_view v) {
  return v.find_first_of(absl::string_view("\r\n\0", 3)) == absl::string_view::npos;
}

void CheckHeaders(const tandem::router::HttpHeaders& headers) {
  for (const auto& [name, value] : headers) {
    FUZZ_CHECK(SafeHeaderValue(name));
    FUZZ_CHECK(SafeHeaderValue(value));
  }
}

// Parses like the server: header first (header_limit), then the body (body_limit).
std::optional<http::request<http::string_body>> ParseRequest(const uint8_t* data, size_t size) {
  const tandem::router::HttpServerOptions limits;
  http::request_parser<http::string_body> parser;
  parser.body_limit(limits.max_body_bytes);
  parser.header_limit(static_cast<uint32_t>(limits.max_header_bytes));
  parser.eager(true);
  boost::beast::error_code ec;
  // The whole request is at hand, so need_more means the client closed its side there (Beast's
  // read loop calls put() again only with more bytes than before, which put() relies on).
  size_t offset = 0;
  while (!parser.is_done()) {
    size_t used = 0;
    if (offset < size) used = parser.put(boost::asio::buffer(data + offset, size - offset), ec);
    offset += used;
    if (ec && ec != http::error::need_more) return std::nullopt;
    if (ec == http::error::need_more || used == 0) {
      if (!parser.got_some()) return std::nullopt;  // (Beast's read reports end_of_stream)
      ec = {};
      parser.put_eof(ec);
      if (ec) return std::nullopt;
      break;
    }
  }
  if (!parser.is_done()) return std::nullopt;
  return parser.release();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const AccessPolicy& policy = Policies()[data[0] & 3];
  std::optional<http::request<http::string_body>> msg = ParseRequest(data + 1, size - 1);
  if (!msg.has_value()) return 0;

  // As Session::OnBody builds it.
  HttpRequest request;
  request.method = std::string(msg->method_string());
  request.target = std::string(msg->target());
  request.path = request.target.substr(0, request.target.find('?'));
  for (const auto& field : *msg) {
    request.headers.emplace_back(std::string(field.name_string()), std::string(field.value()));
  }
  request.body = std::move(msg->body());

  // As RouterFrontend::Core::Handle checks it.
  if (std::optional<tandem::router::HttpResponse> preflight = policy.Preflight(request)) {
    FUZZ_CHECK(preflight->status == 204 || preflight->status == 403 || preflight->status == 421);
    CheckHeaders(preflight->headers);
    return 0;
  }
  CheckHeaders(policy.ResponseHeaders(request));
  if (std::optional<tandem::router::ApiError> denied = policy.Check(request)) {
    FUZZ_CHECK(denied->http_status == 401 || denied->http_status == 415 ||
               denied->http_status == 421);
    FUZZ_CHECK(!tandem::router::ErrorJson(*denied).empty());
    return 0;
  }
  const bool chat = request.path == "/v1/chat/completions";
  if ((!chat && request.path != "/v1/completions") || request.method != "POST") return 0;
  absl::StatusOr<tandem::router::OpenAiRequest> parsed =
      chat ? tandem::router::ParseChatCompletionRequest(request.body)
           : tandem::router::ParseCompletionRequest(request.body);
  if (!parsed.ok()) {
    tandem::fuzz::SerializeResponses(tandem::router::OpenAiRequest{}, "", parsed.status());
    return 0;
  }
  std::string text;
  const absl::Status prepared =
      tandem::fuzz::PreparePrompt(tandem::fuzz::BundledFrontendModel(), *parsed, &text);
  tandem::fuzz::SerializeResponses(*parsed, text, prepared);
  return 0;
}
