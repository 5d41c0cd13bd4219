// The one file that knows which transfer backends exist (STYLE.md 8, 9): the registry.
#include "kvtransfer/transfer_backend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kvtransfer/loopback_backend.h"
#if TANDEM_KVTRANSFER_CMA
#include "kvtransfer/cma/cma_backend.h"
#endif
#if TANDEM_KVTRANSFER_UCX
#include "kvtransfer/ucx/ucx_backend.h"
#endif
#if TANDEM_KVTRANSFER_CUDA_IPC
#include "kvtransfer/cuda_ipc/cuda_ipc_backend.h"
#endif
#if TANDEM_KVTRANSFER_NCCL
#include "kvtransfer/nccl/nccl_backend.h"
#endif

namespace tandem::kvtransfer {

const std::vector<BackendEntry>& TransferBackendRegistry() {
  static const std::vector<BackendEntry>* const registry = new std::vector<BackendEntry>{
      {
          .name = "cuda_ipc",
          .summary = "GPU memory of processes on one host (same GPU, NVLink or PCIe peers)",
          .moves_device_memory = true,
          .in_process_only = false,
#if TANDEM_KVTRANSFER_CUDA_IPC
          .create = &CreateCudaIpcBackend,
          .missing = "",
#else
          .create = nullptr,
          .missing = "this build has no CUDA (configure with TANDEM_CUDA=ON)",
#endif
      },
      {
          .name = "nccl",
          .summary =
              "GPU memory between GPUs on any hosts (NCCL send/recv, a communicator per pair)",
          .moves_device_memory = true,
          .in_process_only = false,
#if TANDEM_KVTRANSFER_NCCL
          .create = &CreateNcclBackend,
          .missing = "",
#else
          .create = nullptr,
          .missing =
              "this build has no nccl backend (configure with TANDEM_CUDA=ON where nccl.h is "
              "found)",
#endif
      },
      {
          .name = "cma",
          .summary =
              "host memory between processes on one host (process_vm_writev from copy threads)",
          .moves_device_memory = false,
          .in_process_only = false,
#if TANDEM_KVTRANSFER_CMA
          .create = &CreateCmaBackend,
          .missing = "",
#else
          .create = nullptr,
          .missing = "this build has no cma backend (it needs Linux: process_vm_writev)",
#endif
      },
      {
          .name = "ucx",
          .summary = "host memory anywhere (UCX one-sided puts: shared memory, tcp, RDMA)",
          .moves_device_memory = false,
          .in_process_only = false,
#if TANDEM_KVTRANSFER_UCX
          .create = &CreateUcxBackend,
          .missing = "",
#else
          .create = nullptr,
          .missing =
              "this build has no UCX (apt-get install libucx-dev, configure with TANDEM_UCX=ON)",
#endif
      },
      {.name = "loopback",
       .summary = "host memory between agents of one process (the reference backend)",
       .moves_device_memory = false,
       .in_process_only = true,
       .create = &CreateLoopbackBackend,
       .missing = ""},
  };
  return *registry;
}

bool TransferBackendBuilt(std::string_view name) {
  for (const BackendEntry& entry : TransferBackendRegistry()) {
    if (entry.name == name) return entry.create != nullptr;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<TransferBackend>> CreateTransferBackend(
    std::string_view name, const BackendOptions& options) {
  std::vector<std::string> names;
  for (const BackendEntry& entry : TransferBackendRegistry()) {
    if (entry.name == name) {
      if (entry.create == nullptr) {
        return absl::UnimplementedError(
            absl::StrCat(std::string(name), ": ", std::string(entry.missing)));
      }
      return entry.create(options);
    }
    names.emplace_back(entry.name);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown transfer backend '", std::string(name),
                                                 "' (choices: ", absl::StrJoin(names, ", "), ")"));
}

}  // namespace tandem::kvtransfer
