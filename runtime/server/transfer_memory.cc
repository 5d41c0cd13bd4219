#include "runtime/server/transfer_memory.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
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

absl::StatusOr<std::vector<TransferLaneSetup>> StartTransferLanes(
    Engine& engine, std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends,
    absl::Duration setup_timeout) {
  if (backends.empty()) return absl::InvalidArgumentError("worker: no transfer backend");
  std::vector<TransferLaneSetup> lanes;
  absl::flat_hash_set<std::string> names;
  for (std::unique_ptr<kvtransfer::TransferBackend>& backend : backends) {
    const std::string name(backend->name());
    if (!names.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker: transfer backend '", name, "' twice"));
    }
    TransferLaneSetup lane;
    ASSIGN_OR_RETURN(lane.memory, ChooseTransferMemory(engine, backend->capabilities(), name));
    lane.thread = std::make_unique<kvtransfer::TransferThread>(std::move(backend));
    const TransferMemory& memory = lane.memory;
    uint64_t* region_id = &lane.region_id;
    RETURN_IF_ERROR(lane.thread->Run(
        [&memory, region_id](kvtransfer::TransferBackend& b) -> absl::Status {
          ASSIGN_OR_RETURN(kvtransfer::MemoryRegion region,
                           b.RegisterMemory(memory.layout.base, memory.layout.bytes, memory.kind));
          *region_id = region.id;
          return absl::OkStatus();
        },
        setup_timeout));
    lanes.push_back(std::move(lane));
  }
  return lanes;
}

}  // namespace tandem::server
