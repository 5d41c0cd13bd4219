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

#include <string>

#include "absl/status/statusor.h"
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

}  // namespace tandem::server
