#pragma once
// What `tandem prefill` and `tandem decode` share besides their role: the transfer backend by
// name with a unique agent name, and termination-signal handling.
//
// Signals: BlockTerminationSignals must run on the main thread before any other thread starts
// (threads inherit the mask), so SIGINT/SIGTERM are only ever taken by WaitForTerminationSignal.

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::server {

// A backend of kvtransfer's factory ("ucx", "loopback", "cuda_ipc"), with agent name
// "<role>-<hostname>-<pid>"; cuda_ipc uses GPU `cuda_device` (the worker's --device ordinal).
absl::StatusOr<std::unique_ptr<kvtransfer::TransferBackend>> CreateWorkerBackend(
    const std::string& kind, const std::string& role, const std::string& ucx_transports,
    int cuda_device);

void BlockTerminationSignals();
// Blocks until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForTerminationSignal();

}  // namespace tandem::server
