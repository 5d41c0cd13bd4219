#pragma once
// Test helper: length-prefixed fields over a pipe (u32 length, then the bytes), as the ucx and
// cma test peers write their agent name, address and region to their parent. Every read has a
// deadline, so a hung peer fails the test instead of hanging it.

#include <poll.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem::kvtransfer::testing {

inline bool WriteAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

inline bool WriteField(int fd, const std::string& field) {
  const uint32_t n = static_cast<uint32_t>(field.size());
  return WriteAll(fd, &n, sizeof(n)) && WriteAll(fd, field.data(), field.size());
}

inline absl::Status ReadExact(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const int64_t left_ms = absl::ToInt64Milliseconds(deadline - absl::Now());
    if (left_ms <= 0) return absl::DeadlineExceededError("reading from the child timed out");
    pollfd pfd{.fd = fd, .events = POLLIN, .revents = 0};
    if (poll(&pfd, 1, static_cast<int>(left_ms)) <= 0) continue;
    const ssize_t r = read(fd, p, n);
    if (r <= 0) return absl::UnavailableError("child closed its pipe");
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

inline absl::StatusOr<std::string> ReadField(int fd, absl::Time deadline) {
  uint32_t n = 0;
  if (absl::Status s = ReadExact(fd, &n, sizeof(n), deadline); !s.ok()) return s;
  if (n > (1u << 20)) return absl::InternalError("oversized field from child");
  std::string field(n, '\0');
  if (absl::Status s = ReadExact(fd, field.data(), n, deadline); !s.ok()) return s;
  return field;
}

}  // namespace tandem::kvtransfer::testing
