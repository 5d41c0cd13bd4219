#include "runtime/device/device.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "runtime/device/device_checks.h"

namespace tandem {

std::string_view DeviceKindName(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::Status CheckBufferRange(const DeviceBuffer& buffer, size_t offset, size_t bytes,
                              std::string_view what) {
  if (bytes == 0) return absl::OkStatus();
  if (buffer.data == nullptr)
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), " is null"));
  if (offset > buffer.bytes || bytes > buffer.bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat(std::string(what), " range [", offset, ", +", bytes,
                                              ") exceeds its buffer of ", buffer.bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
