#pragma once
// NCCL, loaded at run time: the handful of entry points the nccl backend uses, resolved from
// dlopen(library) so a binary built with the nccl backend still starts where NCCL is absent (the
// factory then reports Unavailable). Only nccl.h is needed to build. The library is never
// unloaded (NCCL keeps threads).
//
// Thread-safety: the table is immutable after LoadNccl; NCCL's own rules apply to the calls.

#include <nccl.h>

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem::kvtransfer::nccl {

struct NcclApi {
  int version = 0;  // NCCL_VERSION_CODE of the loaded library
  ncclResult_t (*GetVersion)(int*) = nullptr;
  ncclResult_t (*GetUniqueId)(ncclUniqueId*) = nullptr;
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
  ncclResult_t (*CommAbort)(ncclComm_t) = nullptr;
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*) = nullptr;
  ncclResult_t (*Send)(const void*, size_t, ncclDataType_t, int, ncclComm_t,
                       cudaStream_t) = nullptr;
  ncclResult_t (*Recv)(void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t) = nullptr;
  ncclResult_t (*GroupStart)() = nullptr;
  ncclResult_t (*GroupEnd)() = nullptr;
  const char* (*GetErrorString)(ncclResult_t) = nullptr;
  const char* (*GetLastError)(ncclComm_t) = nullptr;
};

// Unavailable "nccl: <library> not found: <dlerror>" when it cannot be loaded or lacks a symbol;
// FailedPrecondition for a library older than 2.19 (non-blocking communicators and their
// error reporting as used here).
absl::StatusOr<std::shared_ptr<const NcclApi>> LoadNccl(const std::string& library);

// OK for ncclSuccess; otherwise "<what>: <NCCL's error string> (<last error>)", Unavailable for
// remote and system errors, Internal otherwise.
absl::Status NcclStatus(const NcclApi& api, ncclResult_t result, std::string_view what,
                        ncclComm_t comm = nullptr);

}  // namespace tandem::kvtransfer::nccl
