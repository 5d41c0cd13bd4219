#pragma once
// Creates Devices by name. This is the one place that knows which backends were compiled in.
//
// Names: "cpu"; "cuda" (= "cuda:0"); "cuda:N" (N a decimal ordinal).
// Errors, never crashes: kInvalidArgument for a malformed or unknown name; kFailedPrecondition for
// "cuda" in a build without CUDA (configure with -DTANDEM_CUDA=ON); kUnavailable when no usable
// GPU or driver is present; kNotFound for an ordinal past the GPUs present.
// Thread-safe; the returned Device is owned by the caller and obeys device.h's threading contract.

#include <memory>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/device/device.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Device>> CreateDevice(std::string_view name);

// Whether this build contains the backend for `kind` (the CPU always; CUDA when TANDEM_CUDA).
bool DeviceBackendCompiledIn(DeviceKind kind);

}  // namespace tandem
