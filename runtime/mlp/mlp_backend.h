#pragma once
// MlpBackend: where a dense model's MLP runs (docs/mlp.md). A runner's layer loop hands it the
// post-attention normed activations of one layer and gets the MLP's output back,
// y = down_proj(silu(gate_proj(x)) * up_proj(x)), asynchronously through a handle, so the
// runner may do other work (another micro-batch's attention) while it computes.
//
// Backends, created by name (registry.h):
//   local          the runner's own fused kernels: no backend object at all (the default);
//   cpu            the MLP weights in host memory, computed with BLAS (cpu_mlp_backend.h);
//   cuda[:N]       the MLP weights in bf16 on a GPU of this host (cuda/cuda_mlp_backend.h);
//   remote:A,B...  `tandem mlp-shard` processes (remote_mlp_backend.h).
//
// Contract:
// - Submit(layer, x, rows, out, deadline) starts layer `layer`'s MLP over `rows` rows of
//   hidden_size float32 at `x` (row-major), to be written to `out` (rows x hidden_size). The
//   caller keeps `x` and `out` alive and leaves them alone until Wait on the handle returns. An
//   error from Submit (InvalidArgument for a layer outside layers() or rows < 1) starts nothing.
// - Wait(handle) returns once `out` holds the result, or with an error, after which `out` is
//   unspecified: DeadlineExceeded when the deadline passed, Unavailable when no backend that
//   serves the layer answered, InvalidArgument for an unknown or already waited handle. Wait
//   never blocks past the Submit's deadline by more than the backend's own grace.
// - Every handle is waited exactly once; handles may be waited in any order.
// - Results are deterministic: the same rows give the same bits, whatever else was in flight.
//
// Thread-safety: Submit and Wait are called from one thread (the engine's); a backend's own
// threads and RPCs are internal.

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::mlp {

// The layers a backend serves, [first, end), and the MLP's shape.
struct MlpShape {
  int first_layer = 0;
  int end_layer = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  bool Serves(int layer) const { return layer >= first_layer && layer < end_layer; }
};

struct MlpBackendStats {
  int64_t calls = 0;        // Submits that started
  int64_t rows = 0;         // rows computed
  int64_t failovers = 0;    // calls moved to another shard, or to the fallback, after a failure
  int64_t failures = 0;     // Waits that returned an error
  int64_t plane_calls = 0;  // remote: calls whose rows moved through the host data plane
};

class MlpBackend {
 public:
  using Handle = uint64_t;

  virtual ~MlpBackend() = default;

  virtual std::string_view name() const = 0;
  virtual MlpShape shape() const = 0;

  virtual absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                        absl::Time deadline) = 0;
  virtual absl::Status Wait(Handle handle) = 0;

  // Whether a call computes after Submit returns, so the caller gains by doing other work
  // before Wait (remote: true; cpu computes inside Submit).
  virtual bool asynchronous() const { return false; }

  // The device path (optional; the CUDA runner uses it when offered): whether the backend takes
  // a layer's rows straight from GPU `device_ordinal`'s memory of the calling process, and
  // EnqueueOnDevice, which queues out[rows, hidden] = MLP(layer, x[rows, hidden]) (bf16 device
  // memory, not overlapping) on `stream` (a cudaStream_t as void*): everything the caller queues
  // on `stream` afterwards sees `out` written. It returns once the work is queued, not run, and
  // never later than `deadline` (DeadlineExceeded); InvalidArgument for a layer outside
  // layers() or rows < 1; after an error nothing the caller must wait for is left queued.
  virtual bool SupportsDevice(int device_ordinal) const { return false; }
  virtual absl::Status EnqueueOnDevice(int layer, const void* x, int rows, void* out, void* stream,
                                       absl::Time deadline) {
    return absl::UnimplementedError("this MLP backend has no device path");
  }

  // Ping-pong on the device path (optional; the CUDA runner's micro-batches use it when
  // device_slots() covers them): SubmitOnDevice queues the same call as EnqueueOnDevice, but only
  // what the caller queues on `stream` after JoinOnDevice(handle, stream) is ordered after `out`
  // is written, so the caller may queue other work (another micro-batch's attention) in between,
  // which the GPU may run while the MLP computes. `row_offset` places the rows in the step's
  // batch: calls in flight at once (submitted, not yet joined) cover disjoint ranges
  // [row_offset, row_offset + rows) within device_max_rows() (InvalidArgument otherwise, and
  // ResourceExhausted past device_slots() calls in flight). Every handle SubmitOnDevice returned
  // is joined exactly once, also after a failure (a Join then only releases it); JoinOnDevice
  // fails for an unknown handle. The defaults: no slots, and a Submit that is EnqueueOnDevice.
  virtual int device_slots() const { return 0; }
  virtual int device_max_rows() const { return 0; }  // 0: any number of rows
  virtual absl::StatusOr<Handle> SubmitOnDevice(int layer, const void* x, int rows, int row_offset,
                                                void* out, void* stream, absl::Time deadline) {
    absl::Status s = EnqueueOnDevice(layer, x, rows, out, stream, deadline);
    if (!s.ok()) return s;
    return Handle{0};
  }
  virtual absl::Status JoinOnDevice(Handle handle, void* stream) { return absl::OkStatus(); }
  // After the caller synchronized the streams it queued device calls on: an error when one of
  // them gave up on the GPU (a bounded wait for another process's work that did not come:
  // cuda_ipc's shard died or stalled inside a layer); the step's outputs are then garbage and
  // must be discarded. Clears what it reported. Default: nothing can fail on the device.
  virtual absl::Status CheckDevice() { return absl::OkStatus(); }

  // Bytes of MLP weights this backend holds in GPU `device_ordinal`'s memory (in this process).
  virtual int64_t device_weight_bytes(int device_ordinal) const { return 0; }

  // Host bytes of MLP weights this backend holds in the calling process (0 for remote ones).
  virtual int64_t resident_weight_bytes() const = 0;

  virtual MlpBackendStats stats() const = 0;

  // Submit then Wait.
  absl::Status Run(int layer, const float* x, int rows, float* out, absl::Time deadline) {
    absl::StatusOr<Handle> h = Submit(layer, x, rows, out, deadline);
    if (!h.ok()) return h.status();
    return Wait(*h);
  }
};

}  // namespace tandem::mlp
