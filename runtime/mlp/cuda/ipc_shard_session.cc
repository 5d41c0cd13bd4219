#include "runtime/mlp/cuda/ipc_shard_session.h"

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/mlp/cuda/cuda_dense_mlp.h"
#include "runtime/mlp/cuda/cuda_mlp_backend.h"
#include "runtime/mlp/cuda/ipc_layer_batcher.h"
#include "runtime/mlp/ipc_doorbell.h"
#include "runtime/mlp/mlp_shard_checks.h"

namespace tandem::mlp {

static_assert(sizeof(cudaIpcMemHandle_t) == kIpcHandleBytes);
static_assert(sizeof(cudaIpcEventHandle_t) == kIpcHandleBytes);

absl::StatusOr<std::string> HostBootId() {
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  if (!(in >> id) || id.empty()) {
    return absl::FailedPreconditionError("cannot read /proc/sys/kernel/random/boot_id");
  }
  return id;
}

absl::StatusOr<std::string> GpuUuid(int device_ordinal) {
  cudaDeviceProp prop;
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, device_ordinal), "cudaGetDeviceProperties");
  std::string hex;
  for (int i = 0; i < 16; ++i) {
    absl::StrAppendFormat(&hex, "%02x", static_cast<unsigned char>(prop.uuid.bytes[i]));
  }
  return hex;
}

namespace {

class IpcShardSession final : public MlpShardSession {
 public:
  IpcShardSession(std::shared_ptr<CudaDenseMlp> mlp, std::shared_ptr<IpcLayerBatcher> batcher,
                  int rows, absl::Duration input_timeout)
      : mlp_(std::move(mlp)),
        batcher_(std::move(batcher)),
        rows_(rows),
        input_timeout_ns_(static_cast<uint64_t>(absl::ToInt64Nanoseconds(input_timeout))) {
    id_ = batcher_->AddSession();
  }

  ~IpcShardSession() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    batcher_->RemoveSession(id_);
    if (cudaSetDevice(mlp_->device()) != cudaSuccess) return;
    batcher_->Synchronize();  // its queued work reads and writes this session's buffers
    for (void* p : {in_, out_, static_cast<void*>(flags_), static_cast<void*>(failed_)}) {
      if (p != nullptr) cudaFree(p);
    }
  }

  absl::Status Init(tandem::v1::MlpAttachResponse* response) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(mlp_->device()), "MLP session: cudaSetDevice");
    const size_t bytes = static_cast<size_t>(rows_) * mlp_->shape().hidden_size * 2;
    for (void** p : {&in_, &out_}) {
      if (cudaError_t e = cudaMalloc(p, bytes); e != cudaSuccess) {
        *p = nullptr;
        return absl::ResourceExhaustedError(absl::StrCat(
            "MLP session: ", bytes, "-byte buffers on the GPU: ", cudaGetErrorString(e)));
      }
    }
    // The two flags (a buffer of their own: the client maps it) and this side's failure word.
    void* flags = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&flags, kIpcFlagsBytes), "MLP session: flags");
    flags_ = static_cast<IpcFlag*>(flags);
    void* failed = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&failed, sizeof(uint32_t)), "MLP session: failure word");
    failed_ = static_cast<uint32_t*>(failed);
    RETURN_IF_CUDA_ERROR(cudaMemset(flags_, 0, kIpcFlagsBytes), "MLP session: flags");
    RETURN_IF_CUDA_ERROR(cudaMemset(failed_, 0, sizeof(uint32_t)), "MLP session: failure word");
    cudaIpcMemHandle_t in_handle, out_handle, flags_handle;
    RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&in_handle, in_), "MLP session: cudaIpcGetMemHandle");
    RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&out_handle, out_),
                         "MLP session: cudaIpcGetMemHandle");
    RETURN_IF_CUDA_ERROR(cudaIpcGetMemHandle(&flags_handle, flags_),
                         "MLP session: cudaIpcGetMemHandle");
    RETURN_IF_CUDA_ERROR(cudaDeviceSynchronize(), "MLP session: set-up");
    ASSIGN_OR_RETURN(IpcDoorbell bell, IpcDoorbell::Create());
    bell_ = std::make_unique<IpcDoorbell>(std::move(bell));
    response->set_input_memory(&in_handle, sizeof(in_handle));
    response->set_output_memory(&out_handle, sizeof(out_handle));
    response->set_flags(&flags_handle, sizeof(flags_handle));
    response->set_doorbell(bell_->name());
    response->set_max_rows(static_cast<uint32_t>(rows_));
    thread_ = std::thread([this] { Serve(); });
    return absl::OkStatus();
  }

 private:
  // Answers the doorbell until stopped: every value read from the page is checked.
  void Serve() {
    if (cudaSetDevice(mlp_->device()) != cudaSuccess) return;
    const MlpShape& shape = mlp_->shape();
    while (!stop_.load()) {
      absl::StatusOr<IpcDoorbell::Request> r =
          bell_->WaitRequest(absl::Now() + absl::Milliseconds(100));
      if (!r.ok()) continue;  // no call yet: look at the stop flag again
      // Checked in int64 so no pair of values overflows: the rows lie inside the buffers.
      if (!shape.Serves(r->layer) || r->rows < 1 || r->row_offset < 0 ||
          int64_t{r->row_offset} + r->rows > rows_) {
        bell_->Finish(r->seq, kIpcCallRefused);
        continue;
      }
      IpcLayerBatcher::Call call;
      call.session = id_;
      call.layer = r->layer;
      call.row_offset = r->row_offset;
      call.rows = r->rows;
      call.in = in_;
      call.out = out_;
      call.in_flag = &flags_[0];
      call.out_flag = &flags_[1];
      call.seq = r->seq;
      call.failed = failed_;
      call.input_timeout_ns = input_timeout_ns_;
      // Returns once queued (alone or with other sessions' rows of this layer); the batcher
      // signals the output flag whatever happened.
      const absl::Status s = batcher_->Run(call);
      if (!s.ok()) LOG(ERROR) << "MLP session: layer " << r->layer << ": " << s;
      bell_->Finish(r->seq, s.ok() ? kIpcCallOk : kIpcCallFailed);
    }
  }

  const std::shared_ptr<CudaDenseMlp> mlp_;
  const std::shared_ptr<IpcLayerBatcher> batcher_;
  int id_ = 0;  // in the batcher
  const int rows_;
  const uint64_t input_timeout_ns_;
  void* in_ = nullptr;
  void* out_ = nullptr;
  IpcFlag* flags_ = nullptr;    // [0] the client's input signal, [1] ours after each layer
  uint32_t* failed_ = nullptr;  // set on the GPU when a wait for the client's signal gave up
  std::unique_ptr<IpcDoorbell> bell_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

absl::StatusOr<ShardCompute> CreateGpuShardCompute(const ModelConfig& config,
                                                   const TensorStore& store, const MlpShape& shape,
                                                   int device_ordinal,
                                                   const ShardComputeOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<CudaDenseMlp> created,
                   CudaDenseMlp::Create(config, store, shape, device_ordinal));
  std::shared_ptr<CudaDenseMlp> mlp = std::move(created);
  LayerGroupPolicy batching;
  batching.window = options.ipc_batch_window;
  ASSIGN_OR_RETURN(std::shared_ptr<IpcLayerBatcher> batcher,
                   IpcLayerBatcher::Create(mlp, batching));
  ShardCompute compute;
  const double layer_bytes = 3.0 * 2 * shape.hidden_size * shape.intermediate_size;
  compute.data_plane_stats = [batcher, layer_bytes] {
    const IpcBatcherStats s = batcher->stats();
    std::string line = absl::StrFormat(
        "GPU data plane: %d calls in %d layer groups (%d of several workers' calls, %d closed by "
        "the window), %d rows, largest group %d rows of %d calls",
        s.calls, s.groups, s.multi_call_groups, s.window_expiries, s.rows, s.max_group_rows,
        s.max_group_calls);
    if (s.timed_groups > 0) {
      const double ms = s.timed_ms / static_cast<double>(s.timed_groups);
      absl::StrAppendFormat(&line,
                            "; a layer's MLP %.3f ms on the GPU at %.1f rows (%d groups timed), "
                            "%.0f GB/s of its weights",
                            ms, static_cast<double>(s.timed_rows) / s.timed_groups, s.timed_groups,
                            layer_bytes / (ms * 1e6));
    }
    return line;
  };
  ASSIGN_OR_RETURN(compute.backend, CreateCudaMlpBackend(mlp));
  ASSIGN_OR_RETURN(const std::string boot_id, HostBootId());
  ASSIGN_OR_RETURN(const std::string uuid, GpuUuid(device_ordinal));
  const absl::Duration input_timeout = options.ipc_input_timeout;
  compute.attach = [mlp, batcher, boot_id, uuid, input_timeout](
                       const tandem::v1::MlpAttachRequest& request,
                       tandem::v1::MlpAttachResponse* response)
      -> absl::StatusOr<std::unique_ptr<MlpShardSession>> {
    if (request.boot_id() != boot_id) {
      return absl::FailedPreconditionError(
          "the GPU data plane needs the attention worker on the shard's host");
    }
    if (request.gpu_uuid() != uuid) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the GPU data plane needs the attention worker on the shard's GPU (", uuid, ")"));
    }
    auto session = std::make_unique<IpcShardSession>(
        mlp, batcher, static_cast<int>(request.max_rows()), input_timeout);
    RETURN_IF_ERROR(session->Init(response));
    return std::unique_ptr<MlpShardSession>(std::move(session));
  };
  return compute;
}

}  // namespace tandem::mlp
