#include "kvtransfer/nccl/nccl_api.h"

#include <dlfcn.h>

#include "absl/strings/str_cat.h"

namespace tandem::kvtransfer::nccl {
namespace {

template <typename Fn>
bool Resolve(void* library, const char* symbol, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(library, symbol));
  return *out != nullptr;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const NcclApi>> LoadNccl(const std::string& library) {
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    return absl::UnavailableError(
        absl::StrCat("nccl: ", library, " not found: ", why != nullptr ? why : "unknown error"));
  }
  auto api = std::make_shared<NcclApi>();
  const bool ok = Resolve(handle, "ncclGetVersion", &api->GetVersion) &&
                  Resolve(handle, "ncclGetUniqueId", &api->GetUniqueId) &&
                  Resolve(handle, "ncclCommInitRankConfig", &api->CommInitRankConfig) &&
                  Resolve(handle, "ncclCommAbort", &api->CommAbort) &&
                  Resolve(handle, "ncclCommGetAsyncError", &api->CommGetAsyncError) &&
                  Resolve(handle, "ncclSend", &api->Send) &&
                  Resolve(handle, "ncclRecv", &api->Recv) &&
                  Resolve(handle, "ncclGroupStart", &api->GroupStart) &&
                  Resolve(handle, "ncclGroupEnd", &api->GroupEnd) &&
                  Resolve(handle, "ncclGetErrorString", &api->GetErrorString) &&
                  Resolve(handle, "ncclGetLastError", &api->GetLastError);
  if (!ok) {
    const char* why = dlerror();
    return absl::UnavailableError(absl::StrCat(
        "nccl: ", library, " not found: ", why != nullptr ? why : "a symbol is missing"));
  }
  if (api->GetVersion(&api->version) != ncclSuccess || api->version < 21900) {
    return absl::FailedPreconditionError(absl::StrCat("nccl: ", library, " is NCCL ", api->version,
                                                      "; the nccl backend needs 2.19 or newer"));
  }
  return std::shared_ptr<const NcclApi>(std::move(api));
}

absl::Status NcclStatus(const NcclApi& api, ncclResult_t result, std::string_view what,
                        ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = api.GetLastError(comm);
  const std::string message =
      absl::StrCat(std::string(what), ": ", api.GetErrorString(result),
                   last != nullptr && *last != '\0' ? absl::StrCat(" (", last, ")") : "");
  if (result == ncclRemoteError || result == ncclSystemError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace tandem::kvtransfer::nccl
