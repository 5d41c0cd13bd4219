#include "runtime/mlp/cuda/cuda_dense_mlp.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/model_kernels.h"
#include "runtime/model/cuda/cublas_gemm.h"
#include "runtime/model/cuda/cuda_tuning.h"

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

}  // namespace

struct CudaDenseMlp::Impl {
  std::unique_ptr<CublasLtGemm> gemm;
  void* cublas_ws = nullptr;
  void* weights = nullptr;
  size_t layer_bytes = 0, down_offset = 0;
  // Workspace: gate_up [cap, 2 inter], act [cap, inter] (bf16).
  void* workspace = nullptr;
  int cap = 0;
  size_t act_offset = 0;
  // Recorded after every call's work, on its stream: the next call (on any stream) waits for it
  // before using the workspace, and growth and destruction synchronize on it. No caller's
  // stream is kept: it may be gone by then.
  cudaEvent_t handoff = nullptr;
  bool used = false;  // handoff has been recorded
};

CudaDenseMlp::CudaDenseMlp(MlpShape shape, int device) : shape_(shape), device_(device) {}

CudaDenseMlp::~CudaDenseMlp() {
  if (impl_ == nullptr || cudaSetDevice(device_) != cudaSuccess) return;
  if (impl_->used) cudaEventSynchronize(impl_->handoff);
  impl_->gemm.reset();
  if (impl_->handoff != nullptr) cudaEventDestroy(impl_->handoff);
  for (void* p : {impl_->weights, impl_->workspace, impl_->cublas_ws}) {
    if (p != nullptr) cudaFree(p);
  }
}

absl::StatusOr<std::unique_ptr<CudaDenseMlp>> CudaDenseMlp::Create(const ModelConfig& config,
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
  std::unique_ptr<CudaDenseMlp> mlp(new CudaDenseMlp(shape, device_ordinal));
  RETURN_IF_ERROR(mlp->Init(store));
  return mlp;
}

absl::Status CudaDenseMlp::Init(const TensorStore& store) {
  impl_ = std::make_unique<Impl>();
  int count = 0;
  RETURN_IF_CUDA_ERROR(cudaGetDeviceCount(&count), "cuda MLP: cudaGetDeviceCount");
  if (device_ < 0 || device_ >= count) {
    return absl::NotFoundError(
        absl::StrCat("cuda MLP: no GPU cuda:", device_, " (", count, " present)"));
  }
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda MLP: cudaSetDevice");
  const int64_t hidden = shape_.hidden_size, inter = shape_.intermediate_size;
  const size_t gate_up_bytes = AlignUp(static_cast<size_t>(2 * inter * hidden) * 2);
  impl_->down_offset = gate_up_bytes;
  impl_->layer_bytes = gate_up_bytes + AlignUp(static_cast<size_t>(hidden * inter) * 2);
  const size_t total = impl_->layer_bytes * (shape_.end_layer - shape_.first_layer);
  if (cudaError_t e = cudaMalloc(&impl_->weights, total); e != cudaSuccess) {
    impl_->weights = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat("cuda MLP: cannot allocate ", total,
                                                     " bytes of weights on cuda:", device_, ": ",
                                                     cudaGetErrorString(e)));
  }
  weight_bytes_ = total;
  std::vector<uint16_t> host(static_cast<size_t>(2 * inter * hidden));
  for (int l = shape_.first_layer; l < shape_.end_layer; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".mlp.");
    ASSIGN_OR_RETURN(TensorView g, store.GetWithShape(p + "gate_proj.weight", {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView u, store.GetWithShape(p + "up_proj.weight", {inter, hidden}));
    ASSIGN_OR_RETURN(TensorView d, store.GetWithShape(p + "down_proj.weight", {hidden, inter}));
    char* dst = static_cast<char*>(impl_->weights) + impl_->layer_bytes * (l - shape_.first_layer);
    ToBf16(g, host.data());
    ToBf16(u, host.data() + inter * hidden);
    RETURN_IF_CUDA_ERROR(cudaMemcpy(dst, host.data(), static_cast<size_t>(2 * inter * hidden) * 2,
                                    cudaMemcpyHostToDevice),
                         "cuda MLP: weight upload");
    ToBf16(d, host.data());
    RETURN_IF_CUDA_ERROR(
        cudaMemcpy(dst + impl_->down_offset, host.data(), static_cast<size_t>(hidden * inter) * 2,
                   cudaMemcpyHostToDevice),
        "cuda MLP: weight upload");
  }
  if (cudaError_t e = cudaMalloc(&impl_->cublas_ws, kCublasWorkspaceBytes); e != cudaSuccess) {
    impl_->cublas_ws = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda MLP: cuBLASLt workspace: ", cudaGetErrorString(e)));
  }
  // The default GEMM routing, as a runner without --cuda-tuning: the same kernels for the same
  // shapes as the attention worker's own MLP would run.
  ASSIGN_OR_RETURN(impl_->gemm,
                   CublasLtGemm::Create(impl_->cublas_ws, kCublasWorkspaceBytes, GemmTuning{}));
  RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&impl_->handoff, cudaEventDisableTiming),
                       "cuda MLP: cudaEventCreate");
  return absl::OkStatus();
}

absl::Status CudaDenseMlp::Reserve(int rows) {
  if (rows <= impl_->cap) return absl::OkStatus();
  const size_t r = static_cast<size_t>(std::max({rows, 64, impl_->cap + impl_->cap / 2}));
  const size_t inter = shape_.intermediate_size;
  if (impl_->used) {
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(impl_->handoff), "cuda MLP: workspace growth");
  }
  if (impl_->workspace != nullptr) cudaFree(impl_->workspace);
  impl_->workspace = nullptr;
  impl_->cap = 0;
  impl_->act_offset = AlignUp(r * 2 * inter * 2);
  const size_t bytes = impl_->act_offset + AlignUp(r * inter * 2);
  if (cudaError_t e = cudaMalloc(&impl_->workspace, bytes); e != cudaSuccess) {
    impl_->workspace = nullptr;
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda MLP: a ", bytes, "-byte workspace: ", cudaGetErrorString(e)));
  }
  impl_->cap = static_cast<int>(r);
  return absl::OkStatus();
}

absl::Status CudaDenseMlp::Forward(int layer, const void* x, int rows, void* y, void* stream) {
  if (!shape_.Serves(layer)) {
    return absl::InvalidArgumentError(absl::StrCat("cuda MLP: layer ", layer, " is not in ",
                                                   shape_.first_layer, ":", shape_.end_layer));
  }
  if (rows < 1) return absl::InvalidArgumentError(absl::StrCat("cuda MLP: ", rows, " rows"));
  absl::MutexLock lock(&mu_);
  RETURN_IF_CUDA_ERROR(cudaSetDevice(device_), "cuda MLP: cudaSetDevice");
  RETURN_IF_ERROR(Reserve(rows));
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (impl_->used) {
    // After the last call's work, whichever stream it was on.
    RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(s, impl_->handoff, 0),
                         "cuda MLP: cudaStreamWaitEvent");
  }
  const int hidden = shape_.hidden_size, inter = shape_.intermediate_size;
  const char* w =
      static_cast<const char*>(impl_->weights) + impl_->layer_bytes * (layer - shape_.first_layer);
  const void* w_gate_up = w;
  const void* w_down = w + impl_->down_offset;
  char* ws = static_cast<char*>(impl_->workspace);
  void* gate_up = ws;
  void* act = ws + impl_->act_offset;
  CublasLtGemm& gemm = *impl_->gemm;
  if (gemm.FusesGatedSilu(rows, hidden, inter, x, w_gate_up)) {
    RETURN_IF_ERROR(gemm.LinearGatedSilu(x, w_gate_up, rows, hidden, inter, act, stream));
  } else {
    RETURN_IF_ERROR(gemm.Linear(x, w_gate_up, nullptr, rows, hidden, 2 * inter, gate_up,
                                GemmOut::kBf16, stream));
    RETURN_IF_ERROR(cuda::LaunchSiluMul(gate_up, rows, inter, act, stream));
  }
  RETURN_IF_ERROR(
      gemm.Linear(act, w_down, nullptr, rows, inter, hidden, y, GemmOut::kBf16, stream));
  RETURN_IF_CUDA_ERROR(cudaEventRecord(impl_->handoff, s), "cuda MLP: cudaEventRecord");
  impl_->used = true;
  return absl::OkStatus();
}

}  // namespace tandem::mlp
