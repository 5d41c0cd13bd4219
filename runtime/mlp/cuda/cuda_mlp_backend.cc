#include "runtime/mlp/cuda/cuda_mlp_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/model_kernels.h"
#include "runtime/model/cuda/cublas_gemm.h"

namespace tandem::mlp {
namespace {

using cuda_runner::CublasLtGemm;
using cuda_runner::GemmOut;

constexpr size_t kAlign = 256;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Copies `view` (bf16, f16 or f32) as bf16 to `dst` (host).
void ToBf16(const TensorView& view, uint16_t* dst) {
  const size_t n = static_cast<size_t>(view.numel());
  if (view.dtype == DType::kBF16) {
    std::memcpy(dst, view.data, n * 2);
    return;
  }
  std::vector<float> f;
  TensorStore::ToFloat32(view, &f);
  for (size_t i = 0; i < n; ++i) dst[i] = FloatToBf16(f[i]);
}

class CudaMlpBackend final : public MlpBackend {
 public:
  CudaMlpBackend(MlpShape shape, int device) : shape_(shape), device_(device) {}

  ~CudaMlpBackend() override {
    if (cudaSetDevice(device_) != cudaSuccess) return;
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    gemm_.reset();
    for (void* p : {weights_, workspace_, cublas_ws_}) {
      if (p != nullptr) cudaFree(p);
    }
    if (host_ != nullptr) cudaFreeHost(host_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const TensorStore& store) {
    int count = 0;
    RETURN_IF_CUDA_ERROR(cudaGetDeviceCount(&count), "cuda MLP: cudaGetDeviceCount");
    if (device_ < 0 || device_ >= count) {
      return absl::NotFoundError(
          absl::StrCat("cuda MLP: no GPU cuda:", device_, " (", count, " present)"));
    }
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda MLP: cudaSetDevice");
    RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                         "cuda MLP: cudaStreamCreate");
    const int64_t hidden = shape_.hidden_size, inter = shape_.intermediate_size;
    const size_t gate_up_bytes = AlignUp(static_cast<size_t>(2 * inter * hidden) * 2);
    const size_t down_bytes = AlignUp(static_cast<size_t>(hidden * inter) * 2);
    layer_bytes_ = gate_up_bytes + down_bytes;
    const int layers = shape_.end_layer - shape_.first_layer;
    const size_t total = layer_bytes_ * layers;
    if (cudaError_t e = cudaMalloc(&weights_, total); e != cudaSuccess) {
      return absl::ResourceExhaustedError(absl::StrCat("cuda MLP: cannot allocate ", total,
                                                       " bytes of weights on cuda:", device_, ": ",
                                                       cudaGetErrorString(e)));
    }
    std::vector<uint16_t> host(static_cast<size_t>(2 * inter * hidden));
    for (int l = shape_.first_layer; l < shape_.end_layer; ++l) {
      const std::string p = absl::StrCat("model.layers.", l, ".mlp.");
      ASSIGN_OR_RETURN(TensorView g, store.GetWithShape(p + "gate_proj.weight", {inter, hidden}));
      ASSIGN_OR_RETURN(TensorView u, store.GetWithShape(p + "up_proj.weight", {inter, hidden}));
      ASSIGN_OR_RETURN(TensorView d, store.GetWithShape(p + "down_proj.weight", {hidden, inter}));
      char* dst = static_cast<char*>(weights_) + layer_bytes_ * (l - shape_.first_layer);
      ToBf16(g, host.data());
      ToBf16(u, host.data() + inter * hidden);
      RETURN_IF_CUDA_ERROR(cudaMemcpy(dst, host.data(), static_cast<size_t>(2 * inter * hidden) * 2,
                                      cudaMemcpyHostToDevice),
                           "cuda MLP: weight upload");
      ToBf16(d, host.data());
      RETURN_IF_CUDA_ERROR(
          cudaMemcpy(dst + gate_up_bytes, host.data(), static_cast<size_t>(hidden * inter) * 2,
                     cudaMemcpyHostToDevice),
          "cuda MLP: weight upload");
    }
    gate_up_offset_ = 0;
    down_offset_ = gate_up_bytes;
    if (cudaError_t e = cudaMalloc(&cublas_ws_, kCublasWorkspaceBytes); e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda MLP: cuBLASLt workspace: ", cudaGetErrorString(e)));
    }
    ASSIGN_OR_RETURN(gemm_, CublasLtGemm::Create(cublas_ws_, kCublasWorkspaceBytes));
    return Reserve(64);
  }

  std::string_view name() const override { return "cuda"; }
  MlpShape shape() const override { return shape_; }
  int64_t resident_weight_bytes() const override { return 0; }  // none in host memory
  MlpBackendStats stats() const override { return stats_; }

  absl::StatusOr<Handle> Submit(int layer, const float* x, int rows, float* out,
                                absl::Time deadline) override {
    if (!shape_.Serves(layer)) {
      return absl::InvalidArgumentError(absl::StrCat("cuda MLP: layer ", layer, " is not in ",
                                                     shape_.first_layer, ":", shape_.end_layer));
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
  // Device workspace for `rows` rows: x [rows, hidden], gate_up [rows, 2 inter], act [rows,
  // inter], y [rows, hidden] (bf16, each 256-byte aligned); pinned host bf16 [rows, hidden].
  absl::Status Reserve(int rows) {
    if (rows <= cap_) return absl::OkStatus();
    const size_t r = static_cast<size_t>(std::max(rows, cap_ + cap_ / 2));
    const size_t hidden = shape_.hidden_size, inter = shape_.intermediate_size;
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cuda MLP: workspace growth");
    if (workspace_ != nullptr) cudaFree(workspace_);
    if (host_ != nullptr) cudaFreeHost(host_);
    workspace_ = nullptr;
    host_ = nullptr;
    cap_ = 0;
    x_off_ = 0;
    gate_up_off_ = AlignUp(r * hidden * 2);
    act_off_ = gate_up_off_ + AlignUp(r * 2 * inter * 2);
    y_off_ = act_off_ + AlignUp(r * inter * 2);
    const size_t bytes = y_off_ + AlignUp(r * hidden * 2);
    if (cudaError_t e = cudaMalloc(&workspace_, bytes); e != cudaSuccess) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cuda MLP: a ", bytes, "-byte workspace: ", cudaGetErrorString(e)));
    }
    RETURN_IF_CUDA_ERROR(cudaHostAlloc(&host_, r * hidden * 2, cudaHostAllocDefault),
                         "cuda MLP: cudaHostAlloc (staging)");
    cap_ = static_cast<int>(r);
    return absl::OkStatus();
  }

  absl::Status Compute(int layer, const float* x, int rows, float* out) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda MLP: cudaSetDevice");
    RETURN_IF_ERROR(Reserve(rows));
    const int hidden = shape_.hidden_size, inter = shape_.intermediate_size;
    const size_t n = static_cast<size_t>(rows) * hidden;
    uint16_t* staging = static_cast<uint16_t*>(host_);
    for (size_t i = 0; i < n; ++i) staging[i] = FloatToBf16(x[i]);
    char* ws = static_cast<char*>(workspace_);
    void* dx = ws + x_off_;
    void* gate_up = ws + gate_up_off_;
    void* act = ws + act_off_;
    void* y = ws + y_off_;
    const char* w =
        static_cast<const char*>(weights_) + layer_bytes_ * (layer - shape_.first_layer);
    const void* w_gate_up = w + gate_up_offset_;
    const void* w_down = w + down_offset_;
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dx, staging, n * 2, cudaMemcpyHostToDevice, stream_),
                         "cuda MLP: rows host->device copy");
    if (gemm_->FusesGatedSilu(rows, hidden, inter, dx, w_gate_up)) {
      RETURN_IF_ERROR(gemm_->LinearGatedSilu(dx, w_gate_up, rows, hidden, inter, act, stream_));
    } else {
      RETURN_IF_ERROR(gemm_->Linear(dx, w_gate_up, nullptr, rows, hidden, 2 * inter, gate_up,
                                    GemmOut::kBf16, stream_));
      RETURN_IF_ERROR(cuda::LaunchSiluMul(gate_up, rows, inter, act, stream_));
    }
    RETURN_IF_ERROR(
        gemm_->Linear(act, w_down, nullptr, rows, inter, hidden, y, GemmOut::kBf16, stream_));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(staging, y, n * 2, cudaMemcpyDeviceToHost, stream_),
                         "cuda MLP: result device->host copy");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "cuda MLP: layer");
    for (size_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(staging[i]);
    return absl::OkStatus();
  }

  const MlpShape shape_;
  const int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CublasLtGemm> gemm_;
  void* cublas_ws_ = nullptr;
  void* weights_ = nullptr;  // per layer: gate_up [2 inter, hidden], then down [hidden, inter]
  size_t layer_bytes_ = 0, gate_up_offset_ = 0, down_offset_ = 0;
  void* workspace_ = nullptr;
  void* host_ = nullptr;
  int cap_ = 0;
  size_t x_off_ = 0, gate_up_off_ = 0, act_off_ = 0, y_off_ = 0;
  absl::flat_hash_map<Handle, absl::Status> done_;
  Handle next_ = 1;
  MlpBackendStats stats_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MlpBackend>> CreateCudaMlpBackend(const ModelConfig& config,
                                                                 const TensorStore& store,
                                                                 MlpShape shape,
                                                                 int device_ordinal) {
  if (shape.hidden_size != config.hidden_size ||
      shape.intermediate_size != config.intermediate_size || shape.first_layer < 0 ||
      shape.end_layer > config.num_layers || shape.first_layer >= shape.end_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda MLP: layers ", shape.first_layer, ":", shape.end_layer, " of hidden ",
        shape.hidden_size, ", intermediate ", shape.intermediate_size, " do not fit the model"));
  }
  auto backend = std::make_unique<CudaMlpBackend>(shape, device_ordinal);
  RETURN_IF_ERROR(backend->Init(store));
  return std::unique_ptr<MlpBackend>(std::move(backend));
}

}  // namespace tandem::mlp
