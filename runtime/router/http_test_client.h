#pragma once
// Test-only blocking HTTP/1.1 client over a raw POSIX socket, independent of the server's
// Beast code: it writes requests byte for byte and parses responses itself (Content-Length or
// chunked), so the tests check what actually travels on the wire.
//
// Not thread-safe; one connection per object. Reads time out after `timeout` (then fail).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"

namespace tandem::router::testing {

struct ClientResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  bool chunked = false;
  std::string Header(const std::string& name) const {
    auto it = headers.find(absl::AsciiStrToLower(name));
    return it == headers.end() ? "" : it->second;
  }
};

class TestConnection {
 public:
  explicit TestConnection(int port, absl::Duration timeout = absl::Seconds(10)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{};
    tv.tv_sec = static_cast<long>(absl::ToInt64Seconds(timeout));
    tv.tv_usec = static_cast<long>(absl::ToInt64Microseconds(timeout) % 1000000);
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~TestConnection() { Close(); }
  TestConnection(const TestConnection&) = delete;
  TestConnection& operator=(const TestConnection&) = delete;

  bool connected() const { return connected_; }

  bool Send(const std::string& data) {
    size_t off = 0;
    while (off < data.size()) {
      const ssize_t n = ::send(fd_, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }

  // Status line and headers.
  std::optional<ClientResponse> ReadHead() {
    std::optional<std::string> head = ReadUntil("\r\n\r\n");
    if (!head.has_value()) return std::nullopt;
    std::vector<std::string> lines = absl::StrSplit(*head, "\r\n");
    ClientResponse r;
    std::vector<std::string> status_parts = absl::StrSplit(lines[0], absl::MaxSplits(' ', 2));
    if (status_parts.size() < 2 || !absl::SimpleAtoi(status_parts[1], &r.status)) {
      return std::nullopt;
    }
    for (size_t i = 1; i < lines.size(); ++i) {
      if (lines[i].empty()) continue;
      const size_t colon = lines[i].find(':');
      if (colon == std::string::npos) return std::nullopt;
      r.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
          std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
    }
    r.chunked = absl::EqualsIgnoreCase(r.Header("transfer-encoding"), "chunked");
    return r;
  }

  // One chunk's data; "" for the last (zero-length) chunk; nullopt on error.
  std::optional<std::string> ReadChunk() {
    std::optional<std::string> size_line = ReadUntil("\r\n");
    if (!size_line.has_value()) return std::nullopt;
    const size_t size = std::strtoul(size_line->c_str(), nullptr, 16);
    std::optional<std::string> data = ReadExactly(size + 2);
    if (!data.has_value()) return std::nullopt;
    return data->substr(0, size);
  }

  std::optional<ClientResponse> ReadResponse() {
    std::optional<ClientResponse> r = ReadHead();
    if (!r.has_value()) return std::nullopt;
    if (r->chunked) {
      for (;;) {
        std::optional<std::string> chunk = ReadChunk();
        if (!chunk.has_value()) return std::nullopt;
        if (chunk->empty()) break;
        r->body += *chunk;
      }
    } else {
      size_t length = 0;
      if (!absl::SimpleAtoi(r->Header("content-length"), &length)) return std::nullopt;
      std::optional<std::string> body = ReadExactly(length);
      if (!body.has_value()) return std::nullopt;
      r->body = *std::move(body);
    }
    return r;
  }

  // True when the peer closed the connection (read returns 0 or an error) within the timeout.
  bool PeerClosed() {
    if (!buffer_.empty()) return false;
    char c;
    const ssize_t n = ::recv(fd_, &c, 1, 0);
    if (n == 1) buffer_.push_back(c);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
  }

  // Everything the peer sends until it closes the connection (or the read timeout passes).
  std::string ReadUntilClosed() {
    while (Fill()) {
    }
    return std::exchange(buffer_, std::string());
  }

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  bool Fill() {
    char tmp[8192];
    const ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
    if (n <= 0) return false;
    buffer_.append(tmp, static_cast<size_t>(n));
    return true;
  }
  std::optional<std::string> ReadUntil(const std::string& delim) {
    for (;;) {
      const size_t pos = buffer_.find(delim);
      if (pos != std::string::npos) {
        std::string out = buffer_.substr(0, pos);
        buffer_.erase(0, pos + delim.size());
        return out;
      }
      if (!Fill()) return std::nullopt;
    }
  }
  std::optional<std::string> ReadExactly(size_t n) {
    while (buffer_.size() < n) {
      if (!Fill()) return std::nullopt;
    }
    std::string out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  bool connected_ = false;
  std::string buffer_;
};

inline std::string RawRequest(const std::string& method, const std::string& path,
                              const std::string& body, bool keep_alive = true,
                              const std::string& extra_headers = "") {
  std::string req = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: localhost\r\n");
  if (!body.empty() || method == "POST") {
    absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  if (!keep_alive) absl::StrAppend(&req, "Connection: close\r\n");
  absl::StrAppend(&req, extra_headers, "\r\n", body);
  return req;
}

// One request on a fresh connection.
inline std::optional<ClientResponse> Fetch(int port, const std::string& method,
                                           const std::string& path, const std::string& body = "",
                                           const std::string& extra_headers = "") {
  TestConnection conn(port);
  if (!conn.connected() || !conn.Send(RawRequest(method, path, body, false, extra_headers))) {
    return std::nullopt;
  }
  return conn.ReadResponse();
}

// The `data:` payloads of an SSE body, in order.
inline std::vector<std::string> SseEvents(const std::string& body) {
  std::vector<std::string> events;
  for (absl::string_view block : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    absl::string_view data = block;
    if (absl::ConsumePrefix(&data, "data: ")) events.emplace_back(data);
  }
  return events;
}

}  // namespace tandem::router::testing
