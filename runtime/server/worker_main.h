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
#include "absl/time/time.h"
#include "kvtransfer/transfer_backend.h"
#include "runtime/engine/engine.h"

namespace tandem::server {

// The worker's transfer backends for `--kv-transfer KIND`, in preference order, each with agent
// name "<role>-<hostname>-<pid>": one backend by its registry name (kvtransfer's
// TransferBackendRegistry; cuda_ipc and nccl on GPU `cuda_device`), or "auto": every registry
// backend in its preference order (cuda_ipc, nccl, cma, ucx), the device-memory ones only for a
// KV cache on a GPU; one that cannot be created is left out with a warning saying why (an error
// when none can). UCX's network devices follow `bind_host` (TransferNetDevices), so the data plane
// listens only where the worker's gRPC does.
absl::StatusOr<std::vector<std::unique_ptr<kvtransfer::TransferBackend>>> CreateWorkerBackends(
    const std::string& kind, const std::string& role, const std::string& ucx_transports,
    bool kv_on_device, int cuda_device, const std::string& bind_host = "");

// The UCX network devices (UCX_NET_DEVICES syntax) for a worker bound to `bind_host`: "lo" for
// loopback names and addresses; the interface that holds the address for any other address of
// this machine (found with getifaddrs); "" (every device) for "", 0.0.0.0 or ::, which ask for
// every interface. InvalidArgument for an address no interface of this machine has, or a name
// that does not resolve to one.
absl::StatusOr<std::string> TransferNetDevices(const std::string& bind_host);

void BlockTerminationSignals();
// Blocks until SIGINT or SIGTERM arrives; returns the signal number.
int WaitForTerminationSignal();
// Waits up to `timeout` for SIGINT or SIGTERM: the signal number, or 0 when none came.
int WaitForTerminationSignal(absl::Duration timeout);

// One periodic stats line of a worker: "stats <role>: running=.. waiting=.. kv=used/total
// (pct) tokens/s=.. steps=.. finished=..", rates over the time since `previous` (the previous
// stats, taken `elapsed` ago).
std::string WorkerStatsLine(const std::string& role, const EngineStats& now,
                            const EngineStats& previous, absl::Duration elapsed);

}  // namespace tandem::server
