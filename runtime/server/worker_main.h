#pragma once
// What `tandem prefill` and `tandem decode` share besides their role: the transfer backend by
// name with a unique agent name, and termination-signal handling.
//
// Signals: BlockTerminationSignals must run on the main thread before any other thread starts
// (threads inherit the mask), so SIGINT/SIGTERM are only ever taken by WaitForTerminationSignal.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::server {

// The worker's transfer backends for `--kv-transfer KIND`, in preference order, each with agent
// name "<role>-<hostname>-<pid>": "ucx", "loopback" or "cuda_ipc" alone (kvtransfer's factory;
// cuda_ipc on GPU `cuda_device`), or "auto": cuda_ipc then ucx for a KV cache on a GPU (cuda_ipc
// left out, with a warning saying why, where it cannot be created), ucx for a host cache.
absl::StatusOr<std::vector<std::unique_ptr<kvtransfer::TransferBackend>>> CreateWorkerBackends(
    const std::string& kind, const std::string& role, const std::string& ucx_transports,
    bool kv_on_device, int cuda_device);

void BlockTerminationSignals();
// Blocks until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForTerminationSignal();

}  // namespace tandem::server
