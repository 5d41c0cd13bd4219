#pragma once
// Bounds checks every backend applies to a transfer's CopyOps before it moves a byte (a peer's
// region and the request's offsets come from another process). Stateless, thread-safe.

#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {

// InvalidArgument (prefixed "<backend>: ", naming the op) unless every op lies inside a local
// region of `local_length` and a remote region of `remote_length` bytes (overflow-safe).
absl::Status CheckOpsInRegions(std::string_view backend, std::span<const CopyOp> ops,
                               uint64_t local_length, uint64_t remote_length);

}  // namespace tandem::kvtransfer
