#include "runtime/base/secrets.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/escaping.h"

namespace tandem {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= x ^ y;
  }
  return diff == 0;
}

absl::StatusOr<std::string> RandomBytes(size_t n) {
  std::string raw(n, '\0');
  size_t filled = 0;
  while (filled < n) {
    const ssize_t got = getrandom(raw.data() + filled, n - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return absl::InternalError("getrandom failed");
    filled += static_cast<size_t>(got);
  }
  return raw;
}

absl::StatusOr<std::string> RandomHex(size_t n) {
  absl::StatusOr<std::string> raw = RandomBytes(n);
  if (!raw.ok()) return raw.status();
  return absl::BytesToHexString(*raw);
}

}  // namespace tandem
