#pragma once
// IpcLayerBatcher: one `tandem mlp-shard --device cuda` computing the cuda_ipc calls of several
// attention workers (sessions, ipc_shard_session.h) of the same layer as one GEMM (docs/mlp.md,
// "GPU data plane"). Decode is bound by reading the MLP weights, so two workers' 64 rows in one
// call read the layer's weights once instead of twice.
//
// A session's thread calls Run() with a checked request; the call joins its layer's group and
// Run returns once the group is queued on the batcher's stream (or failed), so the session can
// answer its doorbell. A group is queued when no other active session can still join it in
// time (runtime/mlp/layer_group_policy.h: every other active session is in the group or already
// past its layer, or the group's window has passed, or it is full). A session behind is waited
// for, up to the window: that is how workers that start out of step fall into step, after which
// each layer's calls of both arrive together; an idle worker costs the busy ones nothing.
//
// Queuing a group of several calls: the stream waits for each call's input event, gathers the
// rows into one buffer, runs the layer once, scatters each call's rows back to its output
// buffer and records each call's output event. A group of one call runs in place (no copies).
//
// Thread-safety: Run, AddSession, RemoveSession and stats from any thread; one group is queued
// at a time. No CUDA types here.

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "runtime/mlp/cuda/cuda_dense_mlp.h"
#include "runtime/mlp/cuda/ipc_flags.h"
#include "runtime/mlp/layer_group_policy.h"

namespace tandem::mlp {

struct IpcBatcherStats {
  int64_t calls = 0;
  int64_t groups = 0;  // layer runs queued
  int64_t rows = 0;
  int64_t max_group_rows = 0;
  int64_t max_group_calls = 0;
  int64_t multi_call_groups = 0;  // groups of two calls or more
  int64_t window_expiries = 0;    // groups queued because their window passed
  // The layer runs' GPU time (CUDA events around each group's MLP, read back once done; a
  // group whose events were not done when their slot came round again is not counted).
  int64_t timed_groups = 0;
  int64_t timed_rows = 0;
  double timed_ms = 0;
};

class IpcLayerBatcher {
 public:
  // One session's call: `rows` rows at row `row_offset` of its bf16 buffers.
  struct Call {
    int session = 0;
    int layer = 0;
    int row_offset = 0;
    int rows = 0;
    void* in = nullptr;   // the session's input buffer (device)
    void* out = nullptr;  // its output buffer (device)
    // The session's flags (ipc_flags.h): the client signals `seq` on `in_flag` once the rows are
    // in `in` (the group waits for it at most `input_timeout_ns`, and a wait that gives up marks
    // `failed`, the session's device word); `out_flag` is signalled with `seq` and the status in
    // `failed` once the rows are in `out`.
    IpcFlag* in_flag = nullptr;
    IpcFlag* out_flag = nullptr;
    uint32_t seq = 0;
    uint32_t* failed = nullptr;
    uint64_t input_timeout_ns = 0;
  };

  static absl::StatusOr<std::shared_ptr<IpcLayerBatcher>> Create(std::shared_ptr<CudaDenseMlp> mlp,
                                                                 const LayerGroupPolicy& options);
  ~IpcLayerBatcher();
  IpcLayerBatcher(const IpcLayerBatcher&) = delete;
  IpcLayerBatcher& operator=(const IpcLayerBatcher&) = delete;

  int AddSession();
  void RemoveSession(int session);

  // Queues `call` (alone or with other sessions' calls of its layer) and returns once it is
  // queued: OK, or the error of its group's queuing (the output flag is signalled either way).
  absl::Status Run(const Call& call);

  IpcBatcherStats stats() const;
  // Waits for everything queued so far (a session's buffers are about to be freed).
  void Synchronize();

 private:
  IpcLayerBatcher(std::shared_ptr<CudaDenseMlp> mlp, const LayerGroupPolicy& options)
      : mlp_(std::move(mlp)), options_(options) {}
  absl::Status Init();

  struct Waiting {
    const Call* call;
    absl::Status* status;
    bool* done;
  };
  struct Group {
    std::vector<Waiting> calls;
    int rows = 0;
    absl::Time opened;
  };
  // A group's timing events, reused round-robin by the queuing thread.
  struct Timing {
    void* start = nullptr;  // cudaEvent_t
    void* end = nullptr;
    int rows = 0;
    bool pending = false;
  };
  // Queues the group; adds to *timed the earlier groups whose GPU time it read back.
  absl::Status Queue(int layer, const std::vector<Waiting>& calls, int rows,
                     IpcBatcherStats* timed);
  absl::Status Grow(int rows);

  const std::shared_ptr<CudaDenseMlp> mlp_;
  const LayerGroupPolicy options_;
  void* stream_ = nullptr;  // cudaStream_t; used by the queuing thread only
  void* gather_ = nullptr;  // [cap_, hidden] bf16 in, then [cap_, hidden] out
  int cap_ = 0;
  std::vector<Timing> timings_;  // the queuing thread's
  size_t next_timing_ = 0;

  mutable absl::Mutex mu_;
  absl::CondVar changed_;                             // a call arrived or a group was queued
  std::map<int, Group> groups_ ABSL_GUARDED_BY(mu_);  // by layer
  std::map<int, GroupSession> sessions_ ABSL_GUARDED_BY(mu_);
  int next_session_ ABSL_GUARDED_BY(mu_) = 0;
  bool queuing_ ABSL_GUARDED_BY(mu_) = false;
  IpcBatcherStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tandem::mlp
