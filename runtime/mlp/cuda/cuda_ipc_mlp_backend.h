#pragma once
// CudaIpcMlpBackend ("cuda_ipc:ADDR[,ADDR...]"): `tandem mlp-shard --device cuda` processes on
// this host's GPU, reached through the GPU data plane (docs/mlp.md): each layer's rows go from
// the attention worker's GPU memory into the shard's input buffer and back from its output buffer
// as device-to-device copies on the worker's stream, ordered by interprocess events, with one
// doorbell call per layer (ipc_doorbell.h) to have the shard queue the layer. No activation
// crosses the host or gRPC; gRPC carries Info and the Attach session only.
//
// Creation: every shard must answer Info within options.connect_timeout and serve the model
// (fingerprint and sizes; together every layer, mlp_shard_checks.h), then Attach (this process's
// GPU UUID and boot id, rows per call max_rows): its answer is checked (CheckAttachResponse), its
// buffers opened with cudaIpcOpenMemHandle and their mapped size checked against max_rows rows
// (cuMemGetAddressRange), its events with cudaIpcOpenEventHandle, its doorbell with
// IpcDoorbell::Open. Errors name the shard: Unavailable (no answer), FailedPrecondition (another
// model, another GPU or host, a layer no shard serves), InvalidArgument (a malformed answer).
//
// Calls: the device path only (SupportsDevice: the worker's GPU); Submit is Unimplemented (the
// CUDA runner never uses it for a backend with a device path). A step's rows beyond max_rows go
// as several calls. A shard that does not take a call by the earlier of the deadline and
// options.call_timeout (DeadlineExceeded), answers an error (Internal), or whose Attach call
// ended (Unavailable: the shard stopped or died) fails the call; such a shard is not used again
// (the worker fails the step's requests, and needs a restart to attach again). Nothing waits
// without a deadline on the host.
//
// Thread-safety: one thread at a time (the runner's); a watcher thread per shard notices the end
// of its Attach call.

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/mlp/mlp_backend.h"
#include "runtime/mlp/remote_mlp_options.h"

namespace tandem::auth {
class ServiceIdentity;
}  // namespace tandem::auth

namespace tandem::mlp {

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaIpcMlpBackend(
    const std::vector<std::string>& addresses,
    std::shared_ptr<const auth::ServiceIdentity> identity, const MlpShape& expected,
    const std::string& model_fingerprint, int device_ordinal, int max_rows,
    const RemoteMlpOptions& options);

}  // namespace tandem::mlp
