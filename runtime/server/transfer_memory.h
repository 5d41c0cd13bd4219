#pragma once
// Which memory a worker's transfer backend registers, decided once at start-up:
// - a host KV cache (CPU runner) and a host-memory backend: Engine::transfer_layout (the cache
//   itself; a test runner may stand in a mirror);
// - a device KV cache and a backend that moves device memory (cuda_ipc): the cache itself, as
//   MemoryKind::kCuda. The engine never stages (no host mirror is even allocated), so nothing of
//   the transfer runs on the engine thread;
// - a device KV cache and a host-memory backend (UCX here, loopback): the engine's pinned host
//   mirror (Engine::transfer_layout), which the engine stages blocks through;
// - a host KV cache and a device-only backend: FailedPrecondition saying so.
//
// Thread-safety: callable from any thread (Engine::transfer_layout is).

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "kvtransfer/handoff/transfer_thread.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/engine/engine.h"

namespace tandem::server {

struct TransferMemory {
  KvCacheLayout layout;  // what to register (offsets identical to the engine's kv_layout())
  kvtransfer::MemoryKind kind = kvtransfer::MemoryKind::kHost;
  bool staged = false;  // the host mirror: the engine copies blocks through it
};

absl::StatusOr<TransferMemory> ChooseTransferMemory(Engine& engine,
                                                    const kvtransfer::Capabilities& backend,
                                                    const std::string& backend_name);

// One backend of a worker, running: its transfer thread (which owns it) and the id under which
// its transfer memory is registered.
struct TransferLaneSetup {
  std::unique_ptr<kvtransfer::TransferThread> thread;
  uint64_t region_id = 0;
  TransferMemory memory;
};

// Starts a transfer thread per backend (in order) and registers each backend's transfer memory
// on it. InvalidArgument for no backend or two of one name; else ChooseTransferMemory's and the
// registration's errors (threads already started are stopped again).
absl::StatusOr<std::vector<TransferLaneSetup>> StartTransferLanes(
    Engine& engine, std::vector<std::unique_ptr<kvtransfer::TransferBackend>> backends,
    absl::Duration setup_timeout);

}  // namespace tandem::server
