// The one file that knows which transfer backends exist (STYLE.md 8, 9).
#include "kvtransfer/transfer_backend.h"

#include "absl/strings/str_cat.h"
#include "kvtransfer/loopback_backend.h"
#include "kvtransfer/ucx/ucx_backend.h"
#if TANDEM_KVTRANSFER_CUDA_IPC
#include "kvtransfer/cuda_ipc/cuda_ipc_backend.h"
#endif
#if TANDEM_KVTRANSFER_NCCL
#include "kvtransfer/nccl/nccl_backend.h"
#endif

namespace tandem::kvtransfer {

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateTransferBackend(
    std::string_view name, const BackendOptions& options) {
  if (name == "loopback") return CreateLoopbackBackend(options);
  if (name == "ucx") return CreateUcxBackend(options);
  if (name == "cuda_ipc") {
#if TANDEM_KVTRANSFER_CUDA_IPC
    return CreateCudaIpcBackend(options);
#else
    return absl::UnimplementedError(
        "cuda_ipc: this build has no CUDA (configure with TANDEM_CUDA=ON)");
#endif
  }
  if (name == "nccl") {
#if TANDEM_KVTRANSFER_NCCL
    return CreateNcclBackend(options);
#else
    return absl::UnimplementedError(
        "nccl: this build has no nccl backend (configure with TANDEM_CUDA=ON where nccl.h is "
        "found)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown transfer backend '", std::string(name),
                                                 "' (choices: loopback, ucx, cuda_ipc, nccl)"));
}

}  // namespace tandem::kvtransfer
