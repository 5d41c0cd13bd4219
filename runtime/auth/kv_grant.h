#pragma once
// KV block grants: a decode worker's proof that it reserved exactly these blocks for this request
// under this transfer epoch, which its prefill worker checks before writing a byte.
//
// At the pair handshake (Prefill.Connect, over an authenticated channel) the decode worker sends a
// fresh random grant key for that pair. Each Prefill.Prefill it sends then carries
// KvGrant(key, pair, epoch, request id, num_cached_tokens, block ids): an HMAC-SHA256 over a
// canonical, length-prefixed encoding of those fields. The prefill worker recomputes it with the
// pair's key and compares in constant time. So another holder of the service credential (the
// router, or whoever stole the token) cannot make a prefill worker write into blocks the decode
// worker did not reserve for that request (KV-cache poisoning), and a captured request cannot be
// replayed with other block ids. The key never leaves the pair's two processes.
//
// Thread safety: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace tandem::auth {

inline constexpr size_t kGrantKeyBytes = 32;
inline constexpr size_t kGrantBytes = 32;

// A fresh random key (kGrantKeyBytes); Internal if the kernel has no randomness.
absl::StatusOr<std::string> NewGrantKey();

// The grant (kGrantBytes raw bytes). `key` must be kGrantKeyBytes long (InvalidArgument otherwise).
absl::StatusOr<std::string> KvGrant(absl::string_view key, absl::string_view pair_id,
                                    uint64_t epoch, absl::string_view request_id,
                                    int32_t num_cached_tokens, absl::Span<const int32_t> block_ids);

// OK when `grant` is KvGrant of the same fields; PermissionDenied otherwise (never says which
// field differs).
absl::Status VerifyKvGrant(absl::string_view key, absl::string_view grant,
                           absl::string_view pair_id, uint64_t epoch, absl::string_view request_id,
                           int32_t num_cached_tokens, absl::Span<const int32_t> block_ids);

}  // namespace tandem::auth
