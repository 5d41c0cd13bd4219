#include "kvtransfer/copy_ops.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer {

absl::Status CheckOpsInRegions(std::string_view backend, std::span<const CopyOp> ops,
                               uint64_t local_length, uint64_t remote_length) {
  for (size_t i = 0; i < ops.size(); ++i) {
    const CopyOp& op = ops[i];
    if (op.length > local_length || op.local_offset > local_length - op.length ||
        op.length > remote_length || op.remote_offset > remote_length - op.length) {
      return absl::InvalidArgumentError(absl::StrCat(
          std::string(backend), ": op ", i, " (local ", op.local_offset, ", remote ",
          op.remote_offset, ", length ", op.length, ") lies outside the regions (local ",
          local_length, " bytes, remote ", remote_length, " bytes)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace tandem::kvtransfer
