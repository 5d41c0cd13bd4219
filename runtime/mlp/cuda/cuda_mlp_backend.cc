#include "runtime/mlp/cuda/cuda_mlp_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/mlp/cuda/cuda_dense_mlp.h"
#include "runtime/mlp/cuda/device_call_slots.h"

namespace tandem::mlp {
namespace {

class CudaMlpBackend final : public MlpBackend {
 public:
  explicit CudaMlpBackend(std::shared_ptr<CudaDenseMlp> mlp) : mlp_(std::move(mlp)) {}

  ~CudaMlpBackend() override {
    if (cudaSetDevice(mlp_->device()) != cudaSuccess) return;
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    slots_.reset();  // waits for the calls still queued on the slots' streams
    mlp_.reset();    // (if last) before the streams it last used go
    if (ready_ != nullptr) cudaEventDestroy(ready_);
    if (rows_ != nullptr) cudaFree(rows_);
    if (host_ != nullptr) cudaFreeHost(host_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(mlp_->device()), "cuda MLP: cudaSetDevice");
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                         "cuda MLP: cudaStreamCreate");
    RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming),
                         "cuda MLP: cudaEventCreate");
    RETURN_IF_ERROR(slots_->Init(mlp_->device(), "cuda MLP"));
    return Reserve(64);
  }

  std::string_view name() const override { return "cuda"; }
  MlpShape shape() const override { return mlp_->shape(); }
  int64_t resident_weight_bytes() const override { return 0; }  // none in host memory
  int64_t device_weight_bytes(int device_ordinal) const override {
    return device_ordinal == mlp_->device() ? static_cast<int64_t>(mlp_->weight_bytes()) : 0;
  }
  MlpBackendStats stats() const override { return stats_; }

  bool SupportsDevice(int device_ordinal) const override {
    return device_ordinal == mlp_->device();
  }
  absl::Status EnqueueOnDevice(int layer, const void* x, int rows, void* out, void* stream,
                               absl::Time deadline) override {
    if (absl::Now() > deadline) {
      ++stats_.failures;
      return absl::DeadlineExceededError(
          absl::StrCat("cuda MLP: layer ", layer, " submitted past its deadline"));
    }
    absl::Status s = mlp_->Forward(layer, x, rows, out, stream);
    ++stats_.calls;
    if (s.ok()) {
      stats_.rows += rows;
    } else {
      ++stats_.failures;
    }
    return s;
  }

  // Ping-pong in one process: the layer runs on a slot's stream behind an event of the caller's,
  // so the caller's stream is free for other work until the Join (the rows are the caller's own
  // memory: no shared buffers, so rows need not be disjoint).
  int device_slots() const override { return DeviceCallSlots::kSlots; }
  absl::StatusOr<Handle> SubmitOnDevice(int layer, const void* x, int rows, int row_offset,
                                        void* out, void* stream, absl::Time deadline) override {
    if (absl::Now() > deadline) {
      ++stats_.failures;
      return absl::DeadlineExceededError(
          absl::StrCat("cuda MLP: layer ", layer, " submitted past its deadline"));
    }
    ASSIGN_OR_RETURN(DeviceCallSlots::Slot * slot,
                     slots_->Find(row_offset, row_offset + rows, /*exclusive_rows=*/false));
    cudaStream_t slot_stream = static_cast<cudaStream_t>(slot->stream);
    RETURN_IF_CUDA_ERROR(cudaEventRecord(ready_, static_cast<cudaStream_t>(stream)),
                         "cuda MLP: cudaEventRecord (rows ready)");
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(slot_stream, ready_, 0),
                         "cuda MLP: cudaStreamWaitEvent (rows ready)");
    absl::Status s = mlp_->Forward(layer, x, rows, out, slot_stream);
    ++stats_.calls;
    if (s.ok()) {
      s = CudaStatus(cudaEventRecord(static_cast<cudaEvent_t>(slot->done), slot_stream),
                     "cuda MLP: cudaEventRecord (done)");
    }
    if (!s.ok()) {
      ++stats_.failures;
      return s;
    }
    stats_.rows += rows;
    return slots_->Issue(slot, row_offset, row_offset + rows);
  }
  absl::Status JoinOnDevice(Handle handle, void* stream) override {
    return slots_->Join(handle, stream);
  }

  absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                absl::Time deadline) override {
    const MlpShape& shape = mlp_->shape();
    if (!shape.Serves(layer)) {
      return absl::InvalidArgumentError(absl::StrCat("cuda MLP: layer ", layer, " is not in ",
                                                     shape.first_layer, ":", shape.end_layer));
    }
    if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("cuda MLP: ", rows, " rows"));
    const Handle h = next_++;
    ++stats_.calls;
    if (absl::Now() > deadline) {
      done_[h] = absl::DeadlineExceededError(
          absl::StrCat("cuda MLP: layer ", layer, " submitted past its deadline"));
      return h;
    }
    absl::Status s = Compute(layer, x, rows, out);
    if (s.ok()) stats_.rows += rows;
    done_[h] = std::move(s);
    return h;
  }

  absl::Status Wait(Handle handle) override {
    auto it = done_.find(handle);
    if (it == done_.end()) {
      return absl::InvalidArgumentError(absl::StrCat("cuda MLP: unknown handle ", handle));
    }
    absl::Status status = std::move(it->second);
    done_.erase(it);
    if (!status.ok()) ++stats_.failures;
    return status;
  }

 private:
  // Device rows x and y [cap, hidden] bf16 each, pinned host bf16 [cap, hidden].
  absl::Status Reserve(int rows) {
    if (rows <= cap_) return absl::OkStatus();
    const size_t r = static_cast<size_t>(std::max(rows, cap_ + cap_ / 2));
    const size_t bytes = r * mlp_->shape().hidden_size * 2;
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cuda MLP: staging growth");
    if (rows_ != nullptr) cudaFree(rows_);
    if (host_ != nullptr) cudaFreeHost(host_);
    rows_ = nullptr;
    host_ = nullptr;
    cap_ = 0;
    if (cudaError_t e = cudaMalloc(&rows_, 2 * bytes); e != cudaSuccess) {
      rows_ = nullptr;
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda MLP: ", 2 * bytes, " bytes of rows: ", cudaGetErrorString(e)));
    }
    RETURN_IF_CUDA_ERROR(cudaHostAlloc(&host_, bytes, cudaHostAllocDefault),
                         "cuda MLP: cudaHostAlloc (staging)");
    cap_ = static_cast<int>(r);
    return absl::OkStatus();
  }

  // Host float32 rows through pinned bf16 and the device, synchronously.
  absl::Status Compute(int layer, const float* x, int rows, float* out) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(mlp_->device()), "cuda MLP: cudaSetDevice");
    RETURN_IF_ERROR(Reserve(rows));
    const size_t n = static_cast<size_t>(rows) * mlp_->shape().hidden_size;
    uint16_t* staging = static_cast<uint16_t*>(host_);
    for (size_t i = 0; i < n; ++i) staging[i] = FloatToBf16(x[i]);
    char* dx = static_cast<char*>(rows_);
    char* dy = dx + static_cast<size_t>(cap_) * mlp_->shape().hidden_size * 2;
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dx, staging, n * 2, cudaMemcpyHostToDevice, stream_),
                         "cuda MLP: rows host->device copy");
    RETURN_IF_ERROR(mlp_->Forward(layer, dx, rows, dy, stream_));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(staging, dy, n * 2, cudaMemcpyDeviceToHost, stream_),
                         "cuda MLP: result device->host copy");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cuda MLP: layer");
    for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(staging[i]);
    return absl::OkStatus();
  }

  std::shared_ptr<CudaDenseMlp> mlp_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;  // the caller's rows are ready (SubmitOnDevice)
  std::unique_ptr<DeviceCallSlots> slots_ = std::make_unique<DeviceCallSlots>();
  void* rows_ = nullptr;  // x then y, [cap_, hidden] bf16 each
  void* host_ = nullptr;
  int cap_ = 0;
  absl::flat_hash_map<Handle, absl::Status> done_;
  Handle next_ = 1;
  MlpBackendStats stats_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend(const ModelConfig& config,
                                                                 const TensorStore& store,
                                                                 MlpShape shape,
                                                                 int device_ordinal) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDenseMlp> mlp,
                   CudaDenseMlp::Create(config, store, shape, device_ordinal));
  return CreateCudaMlpBackend(std::move(mlp));
}

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend(
    std::shared_ptr<CudaDenseMlp> mlp) {
  auto backend = std::make_unique<CudaMlpBackend>(std::move(mlp));
  RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<MlpBackend>(std::move(backend));
}

}  // namespace tandem::mlp
