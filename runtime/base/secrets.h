#pragma once
// Small primitives for handling secrets and unguessable identifiers: constant-time comparison and
// bytes from the kernel's CSPRNG. Used by the HTTP API keys (runtime/router/access_policy.h), the
// service identity (runtime/auth/service_identity.h), request ids, cancel tokens and pair ids.

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tandem {

// `a == b` in time that does not depend on where they first differ (only on the lengths).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// `n` bytes from getrandom(2); Internal if the kernel cannot provide them.
absl::StatusOr<std::string> RandomBytes(size_t n);

// `n` random bytes as 2n lower-case hex characters.
absl::StatusOr<std::string> RandomHex(size_t n);

}  // namespace tandem
