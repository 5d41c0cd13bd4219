#include "runtime/mlp/cuda/ipc_layer_batcher.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"

namespace tandem::mlp {

absl::StatusOr<std::shared_ptr<IpcLayerBatcher>> IpcLayerBatcher::Create(
    std::shared_ptr<CudaDenseMlp> mlp, const LayerGroupPolicy& options) {
  if (mlp == nullptr || options.max_rows < 1 || options.window < absl::ZeroDuration() ||
      options.idle <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("MLP layer batcher: window ", absl::FormatDuration(options.window), ", idle ",
                     absl::FormatDuration(options.idle), ", max_rows ", options.max_rows));
  }
  std::shared_ptr<IpcLayerBatcher> b(new IpcLayerBatcher(std::move(mlp), options));
  RETURN_IF_ERROR(b->Init());
  return b;
}

absl::Status IpcLayerBatcher::Init() {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(mlp_->device()), "MLP layer batcher: cudaSetDevice");
  cudaStream_t s = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                       "MLP layer batcher: cudaStreamCreate");
  stream_ = s;
  timings_.resize(1024);  // the queuing thread may run a few steps ahead of the GPU
  for (Timing& t : timings_) {
    cudaEvent_t start = nullptr, end = nullptr;
    RETURN_IF_CUDA_ERROR(cudaEventCreate(&start), "MLP layer batcher: cudaEventCreate");
    t.start = start;
    RETURN_IF_CUDA_ERROR(cudaEventCreate(&end), "MLP layer batcher: cudaEventCreate");
    t.end = end;
  }
  return absl::OkStatus();
}

IpcLayerBatcher::~IpcLayerBatcher() {
  if (cudaSetDevice(mlp_->device()) != cudaSuccess) return;
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  if (s != nullptr) cudaStreamSynchronize(s);
  if (gather_ != nullptr) cudaFree(gather_);
  for (Timing& t : timings_) {
    for (void* e : {t.start, t.end}) {
      if (e != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    }
  }
  if (s != nullptr) cudaStreamDestroy(s);
}

int IpcLayerBatcher::AddSession() {
  absl::MutexLock lock(&mu_);
  const int id = next_session_++;
  sessions_[id] = GroupSession{};
  return id;
}

void IpcLayerBatcher::RemoveSession(int session) {
  absl::MutexLock lock(&mu_);
  sessions_.erase(session);
  changed_.SignalAll();  // a group may have been waiting for it
}

void IpcLayerBatcher::Synchronize() {
  if (cudaSetDevice(mlp_->device()) != cudaSuccess) return;
  cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
}

IpcBatcherStats IpcLayerBatcher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

absl::Status IpcLayerBatcher::Run(const Call& call) {
  absl::Status status;
  bool done = false;
  absl::MutexLock lock(&mu_);
  absl::Time now = absl::Now();
  GroupSession& session = sessions_[call.session];
  session.last_layer = call.layer;
  session.last_call = now;
  Group& mine = groups_[call.layer];
  if (mine.calls.empty()) mine.opened = now;
  mine.calls.push_back(Waiting{&call, &status, &done});
  mine.rows += call.rows;
  ++stats_.calls;
  changed_.SignalAll();
  while (!done) {
    now = absl::Now();
    // Woken by a call's arrival, a group's queuing (both signal) or the first window's end.
    absl::Time wake = now + absl::Milliseconds(10);
    bool queued_one = false;
    for (auto it = groups_.begin(); !queuing_ && it != groups_.end(); ++it) {
      std::vector<int> members;
      for (const Waiting& w : it->second.calls) members.push_back(w.call->session);
      const GroupReady ready = GroupReadiness(options_, it->first, members, it->second.rows,
                                              it->second.opened, sessions_, now);
      if (ready == GroupReady::kWait) {
        wake = std::min(wake, it->second.opened + options_.window);
        continue;
      }
      // Queue this group (this thread's or another's) outside the lock; one at a time.
      const int layer = it->first;
      const std::vector<Waiting> calls = std::move(it->second.calls);
      const int rows = it->second.rows;
      groups_.erase(it);
      ++stats_.groups;
      stats_.rows += rows;
      stats_.max_group_rows = std::max<int64_t>(stats_.max_group_rows, rows);
      stats_.max_group_calls =
          std::max<int64_t>(stats_.max_group_calls, static_cast<int64_t>(calls.size()));
      if (calls.size() > 1) ++stats_.multi_call_groups;
      if (ready == GroupReady::kWindow) ++stats_.window_expiries;
      queuing_ = true;
      mu_.Unlock();
      IpcBatcherStats timed;
      const absl::Status queued = Queue(layer, calls, rows, &timed);
      mu_.Lock();
      stats_.timed_groups += timed.timed_groups;
      stats_.timed_rows += timed.timed_rows;
      stats_.timed_ms += timed.timed_ms;
      for (const Waiting& w : calls) {
        *w.status = queued;
        *w.done = true;
      }
      queuing_ = false;
      queued_one = true;
      changed_.SignalAll();
      break;
    }
    if (!done && !queued_one) changed_.WaitWithDeadline(&mu_, wake);
  }
  return status;
}

absl::Status IpcLayerBatcher::Grow(int rows) {
  if (rows <= cap_) return absl::OkStatus();
  const size_t row_bytes = static_cast<size_t>(mlp_->shape().hidden_size) * 2;
  const int cap = std::max(rows, cap_ + cap_ / 2);
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)),
                       "MLP layer batcher: growing its buffer");
  if (gather_ != nullptr) cudaFree(gather_);
  gather_ = nullptr;
  cap_ = 0;
  if (cudaError_t e = cudaMalloc(&gather_, 2 * static_cast<size_t>(cap) * row_bytes);
      e != cudaSuccess) {
    gather_ = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("MLP layer batcher: ", cap, " rows: ", cudaGetErrorString(e)));
  }
  cap_ = cap;
  return absl::OkStatus();
}

absl::Status IpcLayerBatcher::Queue(int layer, const std::vector<Waiting>& calls, int rows,
                                    IpcBatcherStats* timed) {
  RETURN_IF_CUDA_ERROR(cudaSetDevice(mlp_->device()), "MLP layer batcher: cudaSetDevice");
  cudaStream_t s = static_cast<cudaStream_t>(stream_);
  // This group's timing slot: read back the group that used it last, if its run is done.
  Timing& timing = timings_[next_timing_];
  next_timing_ = (next_timing_ + 1) % timings_.size();
  if (timing.pending) {
    timing.pending = false;
    float ms = 0;
    if (cudaEventQuery(static_cast<cudaEvent_t>(timing.end)) == cudaSuccess &&
        cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(timing.start),
                             static_cast<cudaEvent_t>(timing.end)) == cudaSuccess) {
      ++timed->timed_groups;
      timed->timed_rows += timing.rows;
      timed->timed_ms += ms;
    } else {
      cudaGetLastError();  // not done yet (cudaErrorNotReady): the sample is dropped
    }
  }
  const size_t row_bytes = static_cast<size_t>(mlp_->shape().hidden_size) * 2;
  absl::Status st;
  // Bounded waits for the clients' input signals (never an event of another process: a dead
  // client's would never fire, and this stream serves every session; ipc_flags.h).
  for (const Waiting& w : calls) {
    if (st.ok()) {
      st =
          EnqueueIpcWait(w.call->in_flag, w.call->seq, w.call->input_timeout_ns, w.call->failed, s);
    }
  }
  // Timed from after the waits: the layer's own GPU time, not the workers' attention before it.
  const bool timed_run =
      st.ok() && cudaEventRecord(static_cast<cudaEvent_t>(timing.start), s) == cudaSuccess;
  auto at = [row_bytes](void* base, int row) { return static_cast<char*>(base) + row * row_bytes; };
  const auto forward = [&](const void* x, int n, void* y) {
    absl::Status f = mlp_->Forward(layer, x, n, y, s);
    if (f.ok() && timed_run &&
        cudaEventRecord(static_cast<cudaEvent_t>(timing.end), s) == cudaSuccess) {
      timing.pending = true;
      timing.rows = n;
    }
    return f;
  };
  if (st.ok() && calls.size() == 1) {
    const Call& c = *calls[0].call;
    st = forward(at(c.in, c.row_offset), c.rows, at(c.out, c.row_offset));
  } else if (st.ok()) {
    st = Grow(rows);
    char* in = static_cast<char*>(gather_);
    char* out = in + static_cast<size_t>(cap_) * row_bytes;
    for (int i = 0, row = 0; st.ok() && i < static_cast<int>(calls.size()); ++i) {
      const Call& c = *calls[i].call;
      st = CudaStatus(cudaMemcpyAsync(in + row * row_bytes, at(c.in, c.row_offset),
                                      c.rows * row_bytes, cudaMemcpyDeviceToDevice, s),
                      "MLP layer batcher: gathering rows");
      row += c.rows;
    }
    if (st.ok()) st = forward(in, rows, out);
    for (int i = 0, row = 0; st.ok() && i < static_cast<int>(calls.size()); ++i) {
      const Call& c = *calls[i].call;
      st = CudaStatus(cudaMemcpyAsync(at(c.out, c.row_offset), out + row * row_bytes,
                                      c.rows * row_bytes, cudaMemcpyDeviceToDevice, s),
                      "MLP layer batcher: scattering rows");
      row += c.rows;
    }
  }
  // Signalled whatever happened (a client waits at most its call timeout in any case).
  for (const Waiting& w : calls) {
    const absl::Status signalled =
        EnqueueIpcSignal(w.call->out_flag, w.call->seq, w.call->failed, s);
    if (st.ok()) st = signalled;
  }
  return st;
}

}  // namespace tandem::mlp
