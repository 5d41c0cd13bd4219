// The one file that knows which transfer backends exist (STYLE.md 8, 9).
#include "kvtransfer/transfer_backend.h"

#include "absl/strings/str_cat.h"
#include "kvtransfer/loopback_backend.h"
#include "kvtransfer/ucx/ucx_backend.h"

namespace tandem::kvtransfer {

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateTransferBackend(
    std::string_view name, const BackendOptions& options) {
  if (name == "loopback") return CreateLoopbackBackend(options);
  if (name == "ucx") return CreateUcxBackend(options);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown transfer backend '", std::string(name), "' (choices: loopback, ucx)"));
}

}  // namespace tandem::kvtransfer
