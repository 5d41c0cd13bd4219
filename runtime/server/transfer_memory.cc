#include "runtime/server/transfer_memory.h"

#include "absl/strings/str_cat.h"
#include "runtime/base/status.h"

namespace tandem::server {

absl::StatusOr<TransferMemory> ChooseTransferMemory(Engine& engine,
                                                    const kvtransfer::Capabilities& backend,
                                                    const std::string& backend_name) {
  const KvCacheLayout& kv = engine.kv_layout();
  TransferMemory m;
  if (kv.on_device && backend.cuda_memory) {
    m.layout = kv;
    m.kind = kvtransfer::MemoryKind::kCuda;
    return m;
  }
  if (!backend.host_memory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV transfer backend '", backend_name,
        "' moves device memory only, and this worker's KV cache is in host memory (use "
        "--device cuda, or another backend)"));
  }
  // The runner's transfer memory: the cache itself for a host runner, its mirror otherwise.
  ASSIGN_OR_RETURN(m.layout, engine.transfer_layout());
  m.staged = m.layout.base != kv.base;
  return m;
}

}  // namespace tandem::server
