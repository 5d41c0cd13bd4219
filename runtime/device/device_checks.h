#pragma once
// Argument checks shared by Device implementations, so every backend reports bad ranges alike.
// Pure functions; thread-safe.

#include <cstddef>
#include <string_view>

#include "absl/status/status.h"
#include "runtime/device/device.h"

namespace tandem {

// OK when [offset, offset + bytes) lies inside `buffer`; kOutOfRange otherwise (overflow included),
// kInvalidArgument for a null buffer when bytes > 0. `what` names the operand in the message.
absl::Status CheckBufferRange(const DeviceBuffer& buffer, size_t offset, size_t bytes,
                              std::string_view what);

}  // namespace tandem
