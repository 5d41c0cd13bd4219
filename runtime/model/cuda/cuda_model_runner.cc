#include "runtime/model/cuda/cuda_model_runner.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/base/float16.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/device/device.h"
#include "runtime/device/device_factory.h"
#include "runtime/kernels/cpu_ops.h"
#include "runtime/kernels/cuda/model_kernels.h"
#include "runtime/kernels/cuda/norm_kernels.h"
#include "runtime/kernels/cuda/sampling_kernels.h"
#include "runtime/kernels/cuda/token_mask_kernels.h"
#include "runtime/mlp/micro_batch_chooser.h"
#include "runtime/model/cuda/cublas_gemm.h"
#include "runtime/model/cuda/kv_host_mirror.h"
#include "runtime/model/cuda/step_plan.h"

namespace tandem {
namespace {

using cuda_runner::CublasLtGemm;
using cuda_runner::GemmOut;
using cuda_runner::StepPlan;

constexpr size_t kAlign = 256;
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
constexpr size_t kStagingBytes = size_t{64} << 20;  // per half of the weight-upload double buffer
constexpr size_t kProgressMinBytes = size_t{256} << 20;

size_t AlignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

absl::Status ValidateConfig(const ModelConfig& c) {
  if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.intermediate_size <= 0 || c.num_layers <= 0 ||
      c.num_heads <= 0 || c.num_kv_heads <= 0 || c.head_dim <= 0 ||
      c.max_position_embeddings <= 0) {
    return absl::InvalidArgumentError("CUDA runner: model config has a non-positive size");
  }
  if (c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: num_heads %d is not a multiple of num_kv_heads %d",
                        c.num_heads, c.num_kv_heads));
  }
  if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: head_dim %d is not supported by the attention kernels (32, 64, 128)",
        c.head_dim));
  }
  return absl::OkStatus();
}

// One tensor of the checkpoint and where its bf16 copy goes in the weight allocation.
struct UploadJob {
  TensorView view;
  size_t offset = 0;  // bytes into the weight buffer
};

class Runner final : public CudaModelRunner {
 public:
  Runner(const ModelConfig& config, const CudaRunnerOptions& options)
      : config_(config), options_(options) {}

  ~Runner() override {
    if (device_ == nullptr) return;
    cudaSetDevice(options_.device_ordinal);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    DropGraphs();
    for (cudaEvent_t e : {upload_events_[0], upload_events_[1]}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    for (void* p : {staging_[0], staging_[1], static_cast<void*>(host_meta_), host_sampling_,
                    host_mask_, static_cast<void*>(progress_host_), host_mlp_}) {
      if (p != nullptr) cudaFreeHost(p);
    }
    gemm_.reset();
    // The Device frees every buffer and stream it handed out.
  }

  absl::Status Init(const TensorStore& store) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(options_.device_ordinal), "cudaSetDevice");
    ASSIGN_OR_RETURN(device_, CreateDevice(absl::StrCat("cuda:", options_.device_ordinal)));
    ASSIGN_OR_RETURN(Stream s, device_->CreateStream());
    stream_ = static_cast<cudaStream_t>(s.native);
    RETURN_IF_ERROR(LoadWeights(store));
    RETURN_IF_ERROR(AllocateKv());
    RETURN_IF_ERROR(InitRope());
    ASSIGN_OR_RETURN(cublas_ws_, device_->Allocate(kCublasWorkspaceBytes));
    ASSIGN_OR_RETURN(gemm_,
                     CublasLtGemm::Create(cublas_ws_.data, cublas_ws_.bytes, options_.tuning.gemm));
    Capacity want;
    want.rows = std::max(options_.max_batch_tokens, cuda_runner::kMaxGraphBatch);
    want.logit_rows = cuda_runner::kMaxGraphBatch;
    want.meta = 4096;
    want.decode_ws = 0;
    RETURN_IF_ERROR(Grow(want));
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "initial upload");
    return absl::OkStatus();
  }

  const ModelConfig& config() const override { return config_; }
  int block_size() const override { return options_.block_size; }
  int num_blocks() const override { return num_blocks_; }
  KvCacheLayout kv_layout() const override { return layout_; }
  // KV transfer through a pinned host mirror of the KV cache (kv_host_mirror.h: as many bytes as
  // kv_layout().bytes, allocated by the first transfer_layout() call; staged on stream_).
  absl::StatusOr<KvCacheLayout> transfer_layout() override {
    return mirror_.Layout(layout_, options_.device_ordinal);
  }
  absl::Status StageKv(std::span<const int32_t> blocks, KvStage dir) override {
    return mirror_.Stage(blocks, dir, stream_);
  }
  // Sampling on the GPU (sampling_kernels.h) for vocabularies the kernel takes.
  bool SupportsDeviceSampling() const override {
    return config_.vocab_size <= cuda::kSamplingMaxVocab;
  }
  CudaStepStats last_step_stats() const override { return stats_; }
  mlp::MlpBackendStats mlp_stats() const override {
    return options_.mlp != nullptr ? options_.mlp->stats() : mlp::MlpBackendStats{};
  }

  absl::Status EnableKvProgress() override {
    if (progress_host_ != nullptr) return absl::OkStatus();
    void* p = nullptr;
    RETURN_IF_CUDA_ERROR(cudaHostAlloc(&p, sizeof(uint64_t), cudaHostAllocMapped),
                         "KV progress counter");
    *static_cast<volatile uint64_t*>(p) = 0;
    void* device = nullptr;
    if (cudaError_t e = cudaHostGetDevicePointer(&device, p, 0); e != cudaSuccess) {
      cudaFreeHost(p);
      return CudaStatus(e, "KV progress counter: device address");
    }
    progress_host_ = static_cast<uint64_t*>(p);
    progress_device_ = static_cast<uint64_t*>(device);
    return absl::OkStatus();
  }
  KvProgress kv_progress() const override {
    return KvProgress{.counter = progress_host_, .next = progress_value_};
  }
  size_t weight_bytes() const override { return weight_bytes_; }

  absl::Status Forward(const ForwardBatch& batch, ForwardOutput* out) override {
    const auto start = std::chrono::steady_clock::now();
    RETURN_IF_ERROR(PlanAndUpload(batch));
    RETURN_IF_ERROR(UploadSampling(batch));
    out->tokens.clear();
    out->logprobs.clear();
    stats_ = CudaStepStats{};
    stats_.rows = plan_.num_rows;
    stats_.graph_bucket = plan_.graph_bucket;
    if (batch.chunks.empty()) {
      out->logits.clear();
      out->rows = 0;
      return absl::OkStatus();
    }
    if (plan_.graph_bucket > 0) {
      RETURN_IF_ERROR(RunGraphed(&stats_.graph_replayed));
    } else {
      RETURN_IF_ERROR(RunDevice(nullptr));
      stats_.micro_batches = step_micro_batches_;
    }
    // Guided rows: their masks are computed on the host now, while the forward pass runs, then
    // applied and sampled after it (outside the graph).
    if (sample_step_ && masked_step_) RETURN_IF_ERROR(SampleMasked(batch));
    stats_.host_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    const int rows = static_cast<int>(plan_.output_rows.size());
    out->rows = rows;
    if (sample_step_) {
      // Sampled on the GPU: tokens and logprobs of every computed-logits row, one copy.
      const int R = plan_.num_logit_rows;
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(static_cast<char*>(host_sampling_) + sampling_out_offset_,
                          static_cast<char*>(sampling_.data) + sampling_out_offset_,
                          static_cast<size_t>(R) * 8, cudaMemcpyDeviceToHost, stream_),
          "sampled tokens device->host copy");
      RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "CUDA forward step");
      RETURN_IF_ERROR(CheckMlpDevice());
      RecordStepTime(start);
      const int32_t* tokens = reinterpret_cast<const int32_t*>(
          static_cast<const char*>(host_sampling_) + sampling_out_offset_);
      const float* logprobs = reinterpret_cast<const float*>(tokens + R);
      out->logits.clear();
      out->tokens.resize(rows);
      out->logprobs.resize(rows);
      for (int i = 0; i < rows; ++i) {
        out->tokens[i] = tokens[plan_.output_rows[i]];
        out->logprobs[i] = logprobs[plan_.output_rows[i]];
      }
      return absl::OkStatus();
    }
    // Logits: contiguous runs of output rows, one copy each, straight into `out`.
    const size_t vocab = config_.vocab_size;
    out->logits.resize(static_cast<size_t>(rows) * vocab);
    const float* logits = static_cast<const float*>(logits_.data);
    for (int i = 0; i < rows;) {
      int j = i + 1;
      while (j < rows && plan_.output_rows[j] == plan_.output_rows[j - 1] + 1) ++j;
      RETURN_IF_CUDA_ERROR(
          cudaMemcpyAsync(out->logits.data() + i * vocab, logits + plan_.output_rows[i] * vocab,
                          (j - i) * vocab * sizeof(float), cudaMemcpyDeviceToHost, stream_),
          "logits device->host copy");
      i = j;
    }
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "CUDA forward step");
    RETURN_IF_ERROR(CheckMlpDevice());
    RecordStepTime(start);
    return absl::OkStatus();
  }

  // After a step's synchronization: whether the MLP backend's device calls gave up on the GPU
  // (MlpBackend::CheckDevice); the step then fails, its outputs unused.
  absl::Status CheckMlpDevice() {
    return options_.mlp != nullptr ? options_.mlp->CheckDevice() : absl::OkStatus();
  }

  // With the micro-batch count chosen from measurements (mlp_micro_batches 0), a ping-pong
  // eligible step's wall time goes to the chooser; its decisions are logged.
  void RecordStepTime(std::chrono::steady_clock::time_point start) {
    if (!step_ping_pong_ || options_.mlp_micro_batches != 0) return;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const int rows = plan_.num_decode;
    if (std::optional<int> decided = chooser_.Record(rows, step_micro_batches_, ms)) {
      const int bucket = mlp::MicroBatchChooser::BucketOf(rows);
      LOG(INFO) << "CUDA runner: decode steps of " << bucket / 2 + 1 << "-" << bucket
                << " rows run the " << options_.mlp->name() << " MLP in " << *decided
                << " micro-batch(es) (measured fastest)";
    }
  }

  absl::StatusOr<double> TimeDeviceStep(const ForwardBatch& batch, int warmup, int iters) override {
    if (batch.chunks.empty() || iters <= 0 || warmup < 0) {
      return absl::InvalidArgumentError("TimeDeviceStep: empty batch or bad iteration counts");
    }
    RETURN_IF_ERROR(PlanAndUpload(batch));
    RETURN_IF_ERROR(UploadSampling(batch));
    cudaGraphExec_t exec = nullptr;
    if (plan_.graph_bucket > 0) {
      bool replayed = false;
      RETURN_IF_ERROR(RunGraphed(&replayed));  // captures when this key is new
      auto it = graphs_.find(GraphKey());
      if (it != graphs_.end()) exec = it->second;
    }
    auto run = [&]() -> absl::Status {
      if (exec != nullptr) {
        RETURN_IF_CUDA_ERROR(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch");
        return absl::OkStatus();
      }
      return RunDevice(nullptr);
    };
    for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(run());
    cudaEvent_t begin = nullptr, end = nullptr;
    RETURN_IF_CUDA_ERROR(cudaEventCreate(&begin), "cudaEventCreate");
    RETURN_IF_CUDA_ERROR(cudaEventCreate(&end), "cudaEventCreate");
    absl::Status status = cudaEventRecord(begin, stream_) == cudaSuccess
                              ? absl::OkStatus()
                              : absl::InternalError("cudaEventRecord");
    for (int i = 0; i < iters && status.ok(); ++i) status = run();
    stats_.micro_batches = exec == nullptr ? step_micro_batches_ : 1;
    float ms = 0;
    if (status.ok()) {
      status = CudaStatus(cudaEventRecord(end, stream_), "cudaEventRecord");
    }
    if (status.ok()) status = CudaStatus(cudaEventSynchronize(end), "timed steps");
    if (status.ok()) status = CheckMlpDevice();
    if (status.ok()) status = CudaStatus(cudaEventElapsedTime(&ms, begin, end), "elapsed");
    cudaEventDestroy(begin);
    cudaEventDestroy(end);
    RETURN_IF_ERROR(status);
    return static_cast<double>(ms) / iters;
  }

  absl::StatusOr<std::vector<OpTiming>> ProfileStep(const ForwardBatch& batch) override {
    if (batch.chunks.empty()) return absl::InvalidArgumentError("ProfileStep: empty batch");
    RETURN_IF_ERROR(PlanAndUpload(batch));
    RETURN_IF_ERROR(UploadSampling(batch));
    RETURN_IF_ERROR(RunDevice(nullptr));  // warm-up (cuBLASLt plans, lazy module loading)
    Profiler prof;
    RETURN_IF_ERROR(prof.Start(stream_));
    absl::Status status = RunDevice(&prof);
    if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "profiled step");
    if (status.ok()) status = CheckMlpDevice();
    std::vector<OpTiming> result;
    if (status.ok()) result = prof.Collect();
    prof.Release();
    RETURN_IF_ERROR(status);
    return result;
  }

 private:
  // Events recorded after each op of an instrumented step.
  struct Profiler {
    cudaStream_t stream = nullptr;
    cudaEvent_t first = nullptr;
    std::vector<std::pair<std::string, cudaEvent_t>> marks;
    absl::Status Start(cudaStream_t s) {
      stream = s;
      RETURN_IF_CUDA_ERROR(cudaEventCreate(&first), "cudaEventCreate");
      RETURN_IF_CUDA_ERROR(cudaEventRecord(first, stream), "cudaEventRecord");
      return absl::OkStatus();
    }
    absl::Status Mark(const char* name) {
      cudaEvent_t e = nullptr;
      RETURN_IF_CUDA_ERROR(cudaEventCreate(&e), "cudaEventCreate");
      marks.emplace_back(name, e);
      RETURN_IF_CUDA_ERROR(cudaEventRecord(e, stream), "cudaEventRecord");
      return absl::OkStatus();
    }
    std::vector<OpTiming> Collect() {
      std::vector<OpTiming> out;
      std::map<std::string, size_t> index;
      cudaEvent_t prev = first;
      for (auto& [name, e] : marks) {
        float ms = 0;
        cudaEventElapsedTime(&ms, prev, e);
        prev = e;
        auto [it, inserted] = index.emplace(name, out.size());
        if (inserted) out.push_back(OpTiming{name, 0, 0});
        out[it->second].ms += ms;
        out[it->second].calls += 1;
      }
      return out;
    }
    void Release() {
      if (first != nullptr) cudaEventDestroy(first);
      for (auto& m : marks) cudaEventDestroy(m.second);
      marks.clear();
    }
  };

  // (graph bucket, decode block-table width, samples on the GPU).
  using GraphKeyType = std::tuple<int, int, bool>;

  struct Capacity {
    int rows = 0;
    int logit_rows = 0;
    size_t meta = 0;  // int32s
    size_t decode_ws = 0;
  };

  struct LayerPtrs {
    const void* input_norm = nullptr;
    const void* qkv = nullptr;       // [(heads + 2 kv_heads) * head_dim, hidden]
    const void* qkv_bias = nullptr;  // [(heads + 2 kv_heads) * head_dim] or null
    const void* o_proj = nullptr;
    const void* post_norm = nullptr;
    const void* gate_up = nullptr;  // [2 * inter, hidden]
    const void* down = nullptr;
  };

  int QWidth() const { return config_.num_heads * config_.head_dim; }
  int KvWidth() const { return config_.num_kv_heads * config_.head_dim; }
  int QkvWidth() const { return QWidth() + 2 * KvWidth(); }

  absl::Status LoadWeights(const TensorStore& store) {
    const ModelConfig& c = config_;
    const int64_t vocab = c.vocab_size, hidden = c.hidden_size, inter = c.intermediate_size;
    const int64_t q = QWidth(), kv = KvWidth();
    std::vector<UploadJob> jobs;
    size_t at = 0;
    // Tensors added back to back share one aligned region (fusion by concatenation of rows).
    auto add = [&](const std::string& name, std::vector<int64_t> shape) -> absl::Status {
      ASSIGN_OR_RETURN(TensorView v, store.GetWithShape(name, shape));
      jobs.push_back(UploadJob{v, at});
      at += static_cast<size_t>(v.numel()) * 2;
      return absl::OkStatus();
    };
    auto region = [&]() {
      at = AlignUp(at);
      return at;
    };
    std::vector<size_t> embed_off(1), final_off(1), head_off(1);
    struct LayerOffsets {
      size_t input_norm, qkv, qkv_bias, o_proj, post_norm, gate_up, down;
    };
    std::vector<LayerOffsets> lo(c.num_layers);
    embed_off[0] = region();
    RETURN_IF_ERROR(add("model.embed_tokens.weight", {vocab, hidden}));
    for (int i = 0; i < c.num_layers; ++i) {
      const std::string p = absl::StrCat("model.layers.", i, ".");
      LayerOffsets& l = lo[i];
      l.input_norm = region();
      RETURN_IF_ERROR(add(p + "input_layernorm.weight", {hidden}));
      l.qkv = region();
      RETURN_IF_ERROR(add(p + "self_attn.q_proj.weight", {q, hidden}));
      RETURN_IF_ERROR(add(p + "self_attn.k_proj.weight", {kv, hidden}));
      RETURN_IF_ERROR(add(p + "self_attn.v_proj.weight", {kv, hidden}));
      l.qkv_bias = region();
      if (c.attention_bias) {
        RETURN_IF_ERROR(add(p + "self_attn.q_proj.bias", {q}));
        RETURN_IF_ERROR(add(p + "self_attn.k_proj.bias", {kv}));
        RETURN_IF_ERROR(add(p + "self_attn.v_proj.bias", {kv}));
      }
      l.o_proj = region();
      RETURN_IF_ERROR(add(p + "self_attn.o_proj.weight", {hidden, q}));
      l.post_norm = region();
      RETURN_IF_ERROR(add(p + "post_attention_layernorm.weight", {hidden}));
      if (options_.mlp != nullptr) continue;  // the MLP runs on the backend
      l.gate_up = region();
      RETURN_IF_ERROR(add(p + "mlp.gate_proj.weight", {inter, hidden}));
      RETURN_IF_ERROR(add(p + "mlp.up_proj.weight", {inter, hidden}));
      l.down = region();
      RETURN_IF_ERROR(add(p + "mlp.down_proj.weight", {hidden, inter}));
    }
    final_off[0] = region();
    RETURN_IF_ERROR(add("model.norm.weight", {hidden}));
    head_off[0] = region();
    if (!c.tie_word_embeddings) RETURN_IF_ERROR(add("lm_head.weight", {vocab, hidden}));
    const size_t total = region();
    weight_bytes_ = 0;
    for (const UploadJob& j : jobs) weight_bytes_ += static_cast<size_t>(j.view.numel()) * 2;

    auto buffer = device_->Allocate(total);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("CUDA runner: cannot allocate ", total,
                                       " bytes of weights: ", buffer.status().message()));
    }
    weights_ = *buffer;
    char* base = static_cast<char*>(weights_.data);
    RETURN_IF_ERROR(Upload(jobs, base));

    embed_ = base + embed_off[0];
    final_norm_ = base + final_off[0];
    lm_head_ = c.tie_word_embeddings ? embed_ : base + head_off[0];
    layers_.resize(c.num_layers);
    for (int i = 0; i < c.num_layers; ++i) {
      LayerPtrs& l = layers_[i];
      l.input_norm = base + lo[i].input_norm;
      l.qkv = base + lo[i].qkv;
      l.qkv_bias = c.attention_bias ? base + lo[i].qkv_bias : nullptr;
      l.o_proj = base + lo[i].o_proj;
      l.post_norm = base + lo[i].post_norm;
      if (options_.mlp == nullptr) {
        l.gate_up = base + lo[i].gate_up;
        l.down = base + lo[i].down;
      }
    }
    return absl::OkStatus();
  }

  // Converts each tensor to bf16 in a pinned staging half and copies it to the GPU while the
  // other half is being filled.
  absl::Status Upload(const std::vector<UploadJob>& jobs, char* base) {
    for (int i = 0; i < 2; ++i) {
      RETURN_IF_CUDA_ERROR(cudaHostAlloc(&staging_[i], kStagingBytes, cudaHostAllocDefault),
                           "cudaHostAlloc (weight staging)");
      RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&upload_events_[i], cudaEventDisableTiming),
                           "cudaEventCreate");
    }
    const bool progress = options_.progress && weight_bytes_ >= kProgressMinBytes;
    size_t done = 0;
    int last_percent = -1;
    int half = 0;
    for (const UploadJob& job : jobs) {
      const size_t elem = DTypeSize(job.view.dtype);
      const size_t numel = static_cast<size_t>(job.view.numel());
      const size_t per_piece = kStagingBytes / 2;  // bf16 elements per staging half
      for (size_t first = 0; first < numel; first += per_piece) {
        const size_t n = std::min(per_piece, numel - first);
        RETURN_IF_CUDA_ERROR(cudaEventSynchronize(upload_events_[half]), "weight upload");
        uint16_t* dst = static_cast<uint16_t*>(staging_[half]);
        const char* src = static_cast<const char*>(job.view.data) + first * elem;
        switch (job.view.dtype) {
          case DType::kBF16:
            std::memcpy(dst, src, n * 2);
            break;
          case DType::kF16:
            for (size_t e = 0; e < n; ++e) {
              uint16_t h;
              std::memcpy(&h, src + e * 2, 2);
              dst[e] = FloatToBf16(F16ToFloat(h));
            }
            break;
          case DType::kF32:
            for (size_t e = 0; e < n; ++e) {
              float f;
              std::memcpy(&f, src + e * 4, 4);
              dst[e] = FloatToBf16(f);
            }
            break;
        }
        RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(base + job.offset + first * 2, dst, n * 2,
                                             cudaMemcpyHostToDevice, stream_),
                             "weight upload");
        RETURN_IF_CUDA_ERROR(cudaEventRecord(upload_events_[half], stream_), "cudaEventRecord");
        half ^= 1;
        done += n * 2;
        const int percent = static_cast<int>(done * 100 / std::max<size_t>(weight_bytes_, 1));
        if (progress && percent != last_percent) {
          last_percent = percent;
          std::fprintf(stderr, "\rloading weights to cuda:%d: %.2f / %.2f GiB (%d%%)",
                       options_.device_ordinal, done / 1073741824.0, weight_bytes_ / 1073741824.0,
                       percent);
          std::fflush(stderr);
        }
      }
    }
    if (progress) std::fprintf(stderr, "\n");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "weight upload");
    return absl::OkStatus();
  }

  absl::Status AllocateKv() {
    const ModelConfig& c = config_;
    const size_t block_bytes =
        static_cast<size_t>(options_.block_size) * c.num_kv_heads * c.head_dim * 2;
    const size_t per_block_all_layers = 2 * block_bytes * c.num_layers;
    int64_t blocks = options_.num_blocks;
    if (blocks == 0) {
      // An offloaded MLP gives its bf16 weight bytes to the KV cache, less what the backend
      // keeps on this GPU (`cuda` here).
      size_t bytes = options_.kv_cache_bytes;
      if (options_.mlp != nullptr) {
        const int64_t kept = options_.mlp->device_weight_bytes(options_.device_ordinal);
        bytes += MlpBf16Bytes() - std::min<size_t>(MlpBf16Bytes(), static_cast<size_t>(kept));
      }
      blocks = static_cast<int64_t>(bytes / per_block_all_layers);
    }
    if (blocks <= 0 || blocks > (int64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "CUDA runner: %d KV blocks (num_blocks %d, kv_cache_bytes %d, %d bytes per block)",
          blocks, options_.num_blocks, options_.kv_cache_bytes, per_block_all_layers));
    }
    num_blocks_ = static_cast<int>(blocks);
    const size_t bytes = per_block_all_layers * num_blocks_;
    auto buffer = device_->Allocate(bytes);
    if (!buffer.ok()) {
      return absl::Status(buffer.status().code(),
                          absl::StrCat("CUDA runner: cannot allocate a ", bytes, "-byte KV cache (",
                                       num_blocks_, " blocks): ", buffer.status().message()));
    }
    kv_ = *buffer;
    RETURN_IF_CUDA_ERROR(cudaMemsetAsync(kv_.data, 0, bytes, stream_), "KV cache memset");
    KvCacheLayout& l = layout_;
    l.base = kv_.data;
    l.bytes = bytes;
    l.on_device = true;
    l.device_ordinal = options_.device_ordinal;
    l.num_layers = c.num_layers;
    l.num_blocks = num_blocks_;
    l.block_size = options_.block_size;
    l.num_kv_heads = c.num_kv_heads;
    l.head_dim = c.head_dim;
    l.elem_bytes = 2;
    l.block_bytes = block_bytes;
    l.block_stride = block_bytes;
    l.kv_stride = block_bytes * num_blocks_;
    l.layer_stride = 2 * l.kv_stride;
    cache_.k = kv_.data;
    cache_.v = static_cast<char*>(kv_.data) + l.kv_stride;
    cache_.num_layers = c.num_layers;
    cache_.num_blocks = num_blocks_;
    cache_.block_size = options_.block_size;
    cache_.num_kv_heads = c.num_kv_heads;
    cache_.head_dim = c.head_dim;
    cache_.layer_stride = l.layer_stride / 2;
    return absl::OkStatus();
  }

  absl::Status InitRope() {
    const ModelConfig& c = config_;
    std::vector<float> inv_freq(c.head_dim / 2);
    if (c.rope_scaling.kind == RopeScaling::Kind::kLlama3) {
      cpu::Llama3RopeScaling s;
      s.factor = c.rope_scaling.factor;
      s.low_freq_factor = c.rope_scaling.low_freq_factor;
      s.high_freq_factor = c.rope_scaling.high_freq_factor;
      s.original_max_position_embeddings = c.rope_scaling.original_max_position_embeddings;
      cpu::RopeInvFreq(c.head_dim, c.rope_theta, &s, inv_freq.data());
    } else {
      cpu::RopeInvFreq(c.head_dim, c.rope_theta, nullptr, inv_freq.data());
    }
    ASSIGN_OR_RETURN(inv_freq_, device_->Allocate(inv_freq.size() * sizeof(float)));
    RETURN_IF_CUDA_ERROR(cudaMemcpy(inv_freq_.data, inv_freq.data(),
                                    inv_freq.size() * sizeof(float), cudaMemcpyHostToDevice),
                         "inv_freq upload");
    return absl::OkStatus();
  }

  // (Re)allocates whatever is below `want`, with headroom. Waits for the stream and drops every
  // captured graph first, since graphs hold the old pointers.
  absl::Status Grow(const Capacity& want) {
    const bool rows = want.rows > cap_.rows, logit_rows = want.logit_rows > cap_.logit_rows;
    const bool meta = want.meta > cap_.meta, ws = want.decode_ws > cap_.decode_ws;
    if (!rows && !logit_rows && !meta && !ws) return absl::OkStatus();
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "workspace growth");
    DropGraphs();
    const ModelConfig& c = config_;
    auto realloc = [this](DeviceBuffer* b, size_t bytes) -> absl::Status {
      if (b->data != nullptr) RETURN_IF_ERROR(device_->Free(*b));
      *b = DeviceBuffer{};
      auto nb = device_->Allocate(std::max<size_t>(bytes, kAlign));
      if (!nb.ok()) {
        return absl::Status(nb.status().code(),
                            absl::StrCat("CUDA runner: cannot allocate a ", bytes,
                                         "-byte workspace: ", nb.status().message()));
      }
      *b = *nb;
      return absl::OkStatus();
    };
    if (rows) {
      const size_t r = std::max(want.rows, cap_.rows + cap_.rows / 2);
      RETURN_IF_ERROR(realloc(&resid_, r * c.hidden_size * 2));
      RETURN_IF_ERROR(realloc(&normed_, r * c.hidden_size * 2));
      RETURN_IF_ERROR(realloc(&h_, r * c.hidden_size * 2));
      RETURN_IF_ERROR(realloc(&qkv_, r * QkvWidth() * 2));
      RETURN_IF_ERROR(realloc(&attn_, r * QWidth() * 2));
      if (options_.mlp == nullptr) {  // the local MLP's workspaces
        RETURN_IF_ERROR(realloc(&gate_up_, r * 2 * c.intermediate_size * 2));
        RETURN_IF_ERROR(realloc(&act_, r * c.intermediate_size * 2));
      } else {
        // Pinned bf16 rows both ways, and their float32 forms for the backend.
        if (host_mlp_ != nullptr) cudaFreeHost(host_mlp_);
        host_mlp_ = nullptr;
        RETURN_IF_CUDA_ERROR(
            cudaHostAlloc(&host_mlp_, r * c.hidden_size * 2 * 2, cudaHostAllocDefault),
            "cudaHostAlloc (MLP staging)");
        mlp_x_.resize(r * c.hidden_size);
        mlp_y_.resize(r * c.hidden_size);
      }
      cap_.rows = static_cast<int>(r);
    }
    if (logit_rows) {
      const size_t r = std::max(want.logit_rows, cap_.logit_rows + cap_.logit_rows / 2);
      RETURN_IF_ERROR(realloc(&last_, r * c.hidden_size * 2));
      RETURN_IF_ERROR(realloc(&logits_, r * c.vocab_size * sizeof(float)));
      // Sampling: [r] SamplingRow, then [r] int32 tokens and [r] float logprobs (packed for the
      // rows of a step, see UploadSampling); the same layout in pinned host memory.
      sampling_out_offset_ = AlignUp(r * sizeof(cuda::SamplingRow));
      const size_t sampling_bytes = sampling_out_offset_ + r * 8;
      RETURN_IF_ERROR(realloc(&sampling_, sampling_bytes));
      if (host_sampling_ != nullptr) cudaFreeHost(host_sampling_);
      host_sampling_ = nullptr;
      RETURN_IF_CUDA_ERROR(cudaHostAlloc(&host_sampling_, sampling_bytes, cudaHostAllocDefault),
                           "cudaHostAlloc (sampling rows)");
      // Grammar masks: [r, words] uint64, then [r] int32 flags, then [r] double log-sum-exps
      // (the host twin holds the first two).
      mask_flags_offset_ = AlignUp(r * MaskWords() * 8);
      mask_lse_offset_ = AlignUp(mask_flags_offset_ + r * sizeof(int32_t));
      RETURN_IF_ERROR(realloc(&mask_, mask_lse_offset_ + r * sizeof(double)));
      if (host_mask_ != nullptr) cudaFreeHost(host_mask_);
      host_mask_ = nullptr;
      RETURN_IF_CUDA_ERROR(cudaHostAlloc(&host_mask_, mask_lse_offset_, cudaHostAllocDefault),
                           "cudaHostAlloc (grammar masks)");
      cap_.logit_rows = static_cast<int>(r);
    }
    if (meta) {
      const size_t n = std::max(want.meta, cap_.meta + cap_.meta / 2);
      RETURN_IF_ERROR(realloc(&meta_, n * sizeof(int32_t)));
      if (host_meta_ != nullptr) cudaFreeHost(host_meta_);
      host_meta_ = nullptr;
      RETURN_IF_CUDA_ERROR(cudaHostAlloc(reinterpret_cast<void**>(&host_meta_), n * sizeof(int32_t),
                                         cudaHostAllocDefault),
                           "cudaHostAlloc (step metadata)");
      cap_.meta = n;
    }
    if (ws) {
      const size_t n = std::max(want.decode_ws, cap_.decode_ws + cap_.decode_ws / 2);
      RETURN_IF_ERROR(realloc(&decode_ws_, n));
      cap_.decode_ws = n;
    }
    return absl::OkStatus();
  }

  void DropGraphs() {
    for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
    graphs_.clear();
    failed_graphs_.clear();
  }

  size_t DecodeWorkspaceBytes() const {
    if (plan_.num_decode == 0) return 0;
    return cuda::DecodeAttentionWorkspaceBytes(plan_.num_decode, config_.num_heads,
                                               config_.head_dim, plan_.decode_max_context,
                                               options_.tuning.decode);
  }

  // Plans the batch into plan_, grows the workspaces if needed and queues the metadata upload.
  absl::Status PlanAndUpload(const ForwardBatch& batch) {
    RETURN_IF_CUDA_ERROR(cudaSetDevice(options_.device_ordinal), "cudaSetDevice");
    cuda_runner::StepPlanLimits limits;
    limits.block_size = options_.block_size;
    limits.num_blocks = num_blocks_;
    limits.vocab_size = config_.vocab_size;
    limits.max_position_embeddings = config_.max_position_embeddings;
    limits.use_graphs = options_.cuda_graphs && options_.mlp == nullptr;
    RETURN_IF_ERROR(cuda_runner::PlanStep(batch, limits, &plan_));
    if (plan_.num_rows == 0) return absl::OkStatus();
    Capacity want;
    want.rows = plan_.num_rows;
    want.logit_rows = plan_.num_logit_rows;
    want.meta = plan_.off.total;
    want.decode_ws = DecodeWorkspaceBytes();
    RETURN_IF_ERROR(Grow(want));
    // The previous step synchronized its stream, so the pinned buffer is free to overwrite.
    std::memcpy(host_meta_, plan_.meta.data(), plan_.off.total * sizeof(int32_t));
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(meta_.data, host_meta_, plan_.off.total * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, stream_),
                         "step metadata upload");
    return absl::OkStatus();
  }

  // Graphs with and without the sampling kernel are different graphs.
  GraphKeyType GraphKey() const {
    return {plan_.graph_bucket, plan_.decode_table_width, SampleInGraph()};
  }
  // The sampling kernel is part of the step's graph, unless a grammar mask goes first.
  bool SampleInGraph() const { return sample_step_ && !masked_step_; }

  // The masked step's tail (model_runner.h, grammar masks): the engine's masks (masks_ready),
  // uploaded per logits row with a flag, the mask kernel (raw log-sum-exp, then -inf for the
  // disallowed tokens), the sampling kernel, and the raw logprobs of the masked rows.
  absl::Status SampleMasked(const ForwardBatch& batch) {
    if (batch.masks_ready) RETURN_IF_ERROR(batch.masks_ready());
    const int R = plan_.num_logit_rows;
    const size_t words = MaskWords();
    uint64_t* host_words = static_cast<uint64_t*>(host_mask_);
    int32_t* host_flags =
        reinterpret_cast<int32_t*>(static_cast<char*>(host_mask_) + mask_flags_offset_);
    std::fill(host_flags, host_flags + R, 0);
    int out_row = 0;
    for (const SequenceChunk& ch : batch.chunks) {
      if (!ch.need_logits) continue;
      const int row = plan_.output_rows[out_row++];
      if (ch.allowed.empty()) continue;
      std::copy(ch.allowed.begin(), ch.allowed.end(),
                host_words + static_cast<size_t>(row) * words);
      host_flags[row] = 1;
    }
    char* dev = static_cast<char*>(mask_.data);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dev, host_words, static_cast<size_t>(R) * words * 8,
                                         cudaMemcpyHostToDevice, stream_),
                         "grammar masks upload");
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dev + mask_flags_offset_, host_flags, R * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, stream_),
                         "grammar mask flags upload");
    int32_t* tokens =
        reinterpret_cast<int32_t*>(static_cast<char*>(sampling_.data) + sampling_out_offset_);
    float* logprobs = reinterpret_cast<float*>(tokens + R);
    const int vocab = config_.vocab_size;
    // The mask kernels' arguments for logits rows [r0, r0 + kSamplingMaxRows).
    const auto mask_args = [&](int r0) {
      cuda::TokenMaskArgs m;
      m.logits = static_cast<float*>(logits_.data) + static_cast<size_t>(r0) * vocab;
      m.allowed = reinterpret_cast<const uint64_t*>(dev) + static_cast<size_t>(r0) * words;
      m.mask = reinterpret_cast<const int32_t*>(dev + mask_flags_offset_) + r0;
      m.rows = std::min(cuda::kSamplingMaxRows, R - r0);
      m.vocab = vocab;
      m.words = static_cast<int>(words);
      m.lse = reinterpret_cast<double*>(dev + mask_lse_offset_) + r0;
      return m;
    };
    for (int r0 = 0; r0 < R; r0 += cuda::kSamplingMaxRows) {
      RETURN_IF_ERROR(cuda::LaunchApplyTokenMask(mask_args(r0), stream_));
    }
    RETURN_IF_ERROR(LaunchSamplingRows(stream_));
    for (int r0 = 0; r0 < R; r0 += cuda::kSamplingMaxRows) {
      RETURN_IF_ERROR(
          cuda::LaunchMaskedLogprobs(mask_args(r0), tokens + r0, logprobs + r0, stream_));
    }
    return absl::OkStatus();
  }

  size_t MaskWords() const { return (static_cast<size_t>(config_.vocab_size) + 63) / 64; }

  // The sampling kernel over every logits row (parameters uploaded by UploadSampling), tokens and
  // logprobs packed at sampling_out_offset_ as [R] int32 then [R] float (R is fixed per graph
  // key, so captured pointers stay right).
  absl::Status LaunchSamplingRows(void* s) {
    const int R = plan_.num_logit_rows;
    const cuda::SamplingRow* rows = static_cast<const cuda::SamplingRow*>(sampling_.data);
    int32_t* tokens =
        reinterpret_cast<int32_t*>(static_cast<char*>(sampling_.data) + sampling_out_offset_);
    float* logprobs = reinterpret_cast<float*>(tokens + R);
    for (int r0 = 0; r0 < R; r0 += cuda::kSamplingMaxRows) {
      cuda::SamplingArgs a;
      a.logits =
          static_cast<const float*>(logits_.data) + static_cast<size_t>(r0) * config_.vocab_size;
      a.params = rows + r0;
      a.rows = std::min(cuda::kSamplingMaxRows, R - r0);
      a.vocab = config_.vocab_size;
      a.tokens = tokens + r0;
      a.logprobs = logprobs + r0;
      RETURN_IF_ERROR(cuda::LaunchSampling(a, s));
    }
    return absl::OkStatus();
  }

  // Decides whether this step samples on the GPU (every output row carries a request and the
  // runner supports it) and, if so, queues the upload of the rows' parameters: one SamplingRow
  // per computed-logits row, padding rows greedy. InvalidArgument (nothing queued) for a request
  // out of range.
  absl::Status UploadSampling(const ForwardBatch& batch) {
    sample_step_ = false;
    masked_step_ = false;
    const int R = plan_.num_logit_rows;
    if (R == 0 || !SupportsDeviceSampling()) return absl::OkStatus();
    for (size_t i = 0; i < batch.chunks.size(); ++i) {
      const SequenceChunk& ch = batch.chunks[i];
      if (!ch.need_logits) continue;
      // A chunk of several rows samples each with its own request, and carries no mask.
      if (ch.sample == nullptr || (ch.num_logits != 1 && !ch.allowed.empty())) {
        return absl::OkStatus();
      }
      for (int k = 0; k < ch.num_logits; ++k) {
        if (absl::Status s = cuda::ValidateSamplingRow(ch.sample[k]); !s.ok()) {
          return absl::InvalidArgumentError(absl::StrCat("chunk ", i, ": ", s.message()));
        }
      }
      if (!ch.allowed.empty() && ch.allowed.size() != MaskWords()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "chunk ", i, ": a grammar mask of ", ch.allowed.size(), " words, need ", MaskWords()));
      }
    }
    for (const SequenceChunk& ch : batch.chunks)
      masked_step_ |= ch.need_logits && !ch.allowed.empty();
    cuda::SamplingRow* rows = static_cast<cuda::SamplingRow*>(host_sampling_);
    for (int r = 0; r < R; ++r) {
      rows[r] = cuda::SamplingRow{};
      rows[r].greedy = 1;
    }
    int out_row = 0;
    for (const SequenceChunk& ch : batch.chunks) {
      if (!ch.need_logits) continue;
      for (int k = 0; k < ch.num_logits; ++k) rows[plan_.output_rows[out_row++]] = ch.sample[k];
    }
    // The previous step synchronized its stream, so the pinned buffer is free to overwrite.
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(sampling_.data, rows, R * sizeof(cuda::SamplingRow),
                                         cudaMemcpyHostToDevice, stream_),
                         "sampling rows upload");
    sample_step_ = true;
    return absl::OkStatus();
  }

  // Replays the graph of plan_'s key, or runs eagerly and captures it for next time.
  absl::Status RunGraphed(bool* replayed) {
    const auto key = GraphKey();
    if (auto it = graphs_.find(key); it != graphs_.end()) {
      RETURN_IF_CUDA_ERROR(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
      *replayed = true;
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(RunDevice(nullptr));
    if (failed_graphs_.contains(key)) return absl::OkStatus();
    RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                         "cudaStreamBeginCapture");
    capturing_ = true;
    absl::Status captured = RunDevice(nullptr);
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
    if (captured.ok()) captured = CudaStatus(end, "cudaStreamEndCapture");
    cudaGraphExec_t exec = nullptr;
    if (captured.ok()) {
      captured = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    }
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (!captured.ok()) {
      cudaGetLastError();
      LOG(WARNING) << "CUDA runner: decode graph capture failed for batch bucket "
                   << std::get<0>(key) << ", running it eagerly: " << captured;
      failed_graphs_.insert(key);
      return absl::OkStatus();
    }
    graphs_.emplace(key, exec);
    return absl::OkStatus();
  }

  // Bytes the MLP weights of every layer take on the GPU in bf16.
  size_t MlpBf16Bytes() const {
    return size_t{3} * 2 * static_cast<size_t>(config_.num_layers) * config_.hidden_size *
           config_.intermediate_size;
  }

  // Layer `layer`'s MLP on options_.mlp over the T rows of normed_, written to h_ (the sublayer
  // output the next norm adds to the residual). A backend with a device path on this GPU queues
  // it on the stream; otherwise normed_ -> pinned host (bf16) -> float32 -> backend -> bf16 ->
  // h_, which waits for the stream (the upload is queued, and the pinned buffer's upload half is
  // rewritten only after the next layer's wait).
  absl::Status OffloadedMlp(int layer, int T) {
    mlp::MlpBackend& backend = *options_.mlp;
    if (backend.SupportsDevice(options_.device_ordinal)) {
      // Straight from normed_ into h_ on the stream: no copy through the host, no wait.
      absl::Status s =
          backend.EnqueueOnDevice(layer, normed_.data, T, h_.data, stream_, absl::InfiniteFuture());
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrFormat("layer %d MLP on the %s backend: %s", layer,
                                                      std::string(backend.name()), s.message()));
      }
      return absl::OkStatus();
    }
    const size_t n = static_cast<size_t>(T) * config_.hidden_size;
    uint16_t* down = static_cast<uint16_t*>(host_mlp_);
    uint16_t* up = down + static_cast<size_t>(cap_.rows) * config_.hidden_size;
    RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(down, normed_.data, n * 2, cudaMemcpyDeviceToHost, stream_),
        "MLP activations device->host copy");
    RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_), "MLP offload: attention");
    for (size_t i = 0; i < n; ++i) mlp_x_[i] = Bf16ToFloat(down[i]);
    absl::Status s = backend.Run(layer, mlp_x_.data(), T, mlp_y_.data(), absl::InfiniteFuture());
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrFormat("layer %d MLP on the %s backend: %s", layer,
                                                    std::string(backend.name()), s.message()));
    }
    for (size_t i = 0; i < n; ++i) up[i] = FloatToBf16(mlp_y_[i]);
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(h_.data, up, n * 2, cudaMemcpyHostToDevice, stream_),
                         "MLP output host->device copy");
    return absl::OkStatus();
  }

  // Rows [row0, row0 + rows) of a step as one unit of the layer loop: its decode rows come
  // first (the plan puts every decode row before the prefill rows), then, in the micro-batch that
  // has them (the whole step's), the prefill rows.
  struct MicroBatch {
    int row0 = 0;
    int rows = 0;
    int num_decode = 0;
    bool prefill = false;
  };

  // The step's micro-batches: one, unless the MLP is offloaded to a backend with device slots
  // and the step is decode-only (ping-pong; docs/mlp.md), when `count` (options, or the
  // chooser's) splits its rows into nearly equal parts.
  std::vector<MicroBatch> PlanMicroBatches(int count) const {
    const StepPlan& p = plan_;
    const int T = p.num_rows, D = p.num_decode;
    count = std::min(count, D);
    if (count < 2 || p.num_prefill > 0 || T != D || capturing_) {
      return {MicroBatch{0, T, D, p.num_prefill > 0}};
    }
    std::vector<MicroBatch> mbs;
    for (int m = 0, row = 0; m < count; ++m) {
      const int rows = D / count + (m < D % count ? 1 : 0);
      mbs.push_back(MicroBatch{row, rows, rows, false});
      row += rows;
    }
    return mbs;
  }

  // Whether a step of the current plan may run in micro-batches at all.
  bool PingPongEligible() const {
    if (options_.mlp == nullptr || !options_.mlp->SupportsDevice(options_.device_ordinal)) {
      return false;
    }
    const int max_rows = options_.mlp->device_max_rows();
    return plan_.num_prefill == 0 && plan_.num_decode >= 2 && plan_.num_rows == plan_.num_decode &&
           (max_rows == 0 || plan_.num_rows <= max_rows);
  }

  // One layer of micro-batch `mb`, from its input norm to the post-attention norm, whose output
  // (the MLP's input) is left in normed_'s rows of `mb`: fused residual RMSNorm (layer 0: the
  // embeddings) -> QKV (+RoPE, KV append) -> decode and/or prefill attention -> O projection into
  // h_ -> fused residual RMSNorm. `last` (the step's last micro-batch) advances the layer
  // progress once every row's KV of the layer is in the cache.
  absl::Status AttentionHalf(int li, const MicroBatch& mb, bool last, Profiler* prof) {
    const ModelConfig& c = config_;
    const StepPlan& p = plan_;
    void* s = stream_;
    const int32_t* meta = static_cast<const int32_t*>(meta_.data);
    const int T = mb.rows, D = mb.num_decode, r0 = mb.row0, hidden = c.hidden_size;
    const int qkv_w = QkvWidth(), q_w = QWidth();
    auto mark = [prof](const char* name) -> absl::Status {
      return prof == nullptr ? absl::OkStatus() : prof->Mark(name);
    };
    const size_t row_bytes = static_cast<size_t>(hidden) * 2;
    char* normed = static_cast<char*>(normed_.data) + r0 * row_bytes;
    char* resid = static_cast<char*>(resid_.data) + r0 * row_bytes;
    char* h = static_cast<char*>(h_.data) + r0 * row_bytes;
    char* qkv = static_cast<char*>(qkv_.data) + static_cast<size_t>(r0) * qkv_w * 2;
    char* attn = static_cast<char*>(attn_.data) + static_cast<size_t>(r0) * q_w * 2;
    const int32_t* positions = meta + p.off.positions + r0;
    const int32_t* slots = meta + p.off.slots + r0;
    auto norm = [&](const void* x, void* residual, const void* weight) {
      cuda::RmsNormArgs a;
      a.x = x;
      a.residual = residual;
      a.weight = weight;
      a.out = normed;
      a.rows = T;
      a.dim = hidden;
      a.eps = c.rms_norm_eps;
      return cuda::LaunchRmsNorm(a, s);
    };
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    const LayerPtrs& lw = layers_[li];
    // The residual stream lives in resid_; h_ holds the last sublayer's output.
    if (li == 0) {
      RETURN_IF_ERROR(norm(resid, nullptr, lw.input_norm));
    } else {
      RETURN_IF_ERROR(norm(h, resid, lw.input_norm));
    }
    RETURN_IF_ERROR(mark("rmsnorm"));
    // The QKV projection runs with RoPE and the KV append in its epilogue where its kernel is
    // ours (the single-token GEMV, cuda::LaunchQkvGemvRopeKvAppend; the skinny GEMM where it
    // takes the call: 2-32 rows on compute capability 9.0 by default, see cublas_gemm.h), each
    // bit-identical to the two launches it replaces: one kernel fewer per layer (H200,
    // Llama-3-8B shape, batch 1 at 1K: 4.16 against 4.24 ms per step; bench/RESULTS.md).
    if (gemm_->UseGemv(T, hidden, normed, lw.qkv)) {
      RETURN_IF_ERROR(cuda::LaunchQkvGemvRopeKvAppend(
          normed, lw.qkv, lw.qkv_bias, T, hidden, qkv, positions,
          static_cast<const float*>(inv_freq_.data), slots, c.num_heads, cache_, li, s));
      RETURN_IF_ERROR(mark("qkv_gemv_rope_kv"));
    } else if (gemm_->FusesQkvRope(T, hidden, qkv_w, normed, lw.qkv)) {
      cuda::SkinnyRope rope;
      rope.num_heads = c.num_heads;
      rope.num_kv_heads = c.num_kv_heads;
      rope.head_dim = c.head_dim;
      rope.positions = positions;
      rope.inv_freq = static_cast<const float*>(inv_freq_.data);
      rope.slot_mapping = slots;
      rope.k_layer = cuda::KvCacheLayerK(cache_, li);
      rope.v_layer = cuda::KvCacheLayerV(cache_, li);
      RETURN_IF_ERROR(
          gemm_->LinearQkvRope(normed, lw.qkv, lw.qkv_bias, T, hidden, qkv_w, rope, qkv, s));
      RETURN_IF_ERROR(mark("qkv_gemm_rope_kv"));
    } else {
      RETURN_IF_ERROR(
          gemm_->Linear(normed, lw.qkv, lw.qkv_bias, T, hidden, qkv_w, qkv, GemmOut::kBf16, s));
      RETURN_IF_ERROR(mark("qkv_gemm"));
      RETURN_IF_ERROR(cuda::LaunchRopeKvAppend(qkv, positions,
                                               static_cast<const float*>(inv_freq_.data), slots, T,
                                               c.num_heads, cache_, li, s));
      RETURN_IF_ERROR(mark("rope_kv_append"));
    }
    // This layer's KV of the step is in the cache: advance the layer progress (eager runs
    // only: a captured value would be replayed stale).
    if (last && progress_device_ != nullptr && !capturing_) {
      RETURN_IF_ERROR(cuda::LaunchStoreProgress(progress_device_, ++progress_value_, s));
    }
    if (D > 0) {
      cuda::DecodeAttentionArgs a;
      a.q = qkv;
      a.q_row_stride = qkv_w;
      a.cache = &cache_;
      a.layer = li;
      a.block_tables = meta + p.off.decode_tables + static_cast<size_t>(r0) * p.decode_table_width;
      a.max_blocks_per_seq = p.decode_table_width;
      a.context_lens = meta + p.off.context_lens + r0;
      a.num_seqs = D;
      a.num_heads = c.num_heads;
      a.scale = scale;
      a.out = attn;
      a.workspace = decode_ws_.data;
      a.workspace_bytes = cap_.decode_ws;
      a.max_context_len = p.decode_max_context;
      a.tuning = options_.tuning.decode;
      RETURN_IF_ERROR(cuda::LaunchPagedDecodeAttention(a, s));
      RETURN_IF_ERROR(mark("attention_decode"));
    }
    if (mb.prefill) {
      cuda::PrefillAttentionArgs a;
      a.q = qkv + static_cast<size_t>(D) * qkv_w * 2;
      a.q_row_stride = qkv_w;
      a.cache = &cache_;
      a.layer = li;
      a.block_tables = meta + p.off.prefill_tables;
      a.max_blocks_per_seq = p.prefill_table_width;
      a.seq_start_rows = meta + p.off.seq_starts;
      a.start_pos = meta + p.off.start_pos;
      a.num_seqs = p.num_prefill;
      a.max_new_tokens = p.prefill_max_new_tokens;
      a.num_heads = c.num_heads;
      a.scale = scale;
      a.out = attn + static_cast<size_t>(D) * q_w * 2;
      RETURN_IF_ERROR(cuda::LaunchPrefillAttention(a, s));
      RETURN_IF_ERROR(mark("attention_prefill"));
    }
    RETURN_IF_ERROR(gemm_->Linear(attn, lw.o_proj, nullptr, T, q_w, hidden, h, GemmOut::kBf16, s));
    RETURN_IF_ERROR(mark("o_gemm"));
    RETURN_IF_ERROR(norm(h, resid, lw.post_norm));
    return mark("rmsnorm");
  }

  // The layer loop in ping-pong (docs/mlp.md): per layer and micro-batch, wait for that
  // micro-batch's MLP of the previous layer (a stream wait, JoinOnDevice), run its attention
  // half and submit its MLP (SubmitOnDevice), so one micro-batch's attention is queued while
  // another's MLP computes. Every submitted call is joined, also after an error.
  absl::Status PingPongLayers(const std::vector<MicroBatch>& mbs, Profiler* prof) {
    mlp::MlpBackend& backend = *options_.mlp;
    const size_t row_bytes = static_cast<size_t>(config_.hidden_size) * 2;
    std::vector<std::optional<mlp::MlpBackend::Handle>> pending(mbs.size());
    absl::Status status;
    for (int li = 0; li < config_.num_layers && status.ok(); ++li) {
      for (size_t m = 0; m < mbs.size() && status.ok(); ++m) {
        const MicroBatch& mb = mbs[m];
        if (pending[m].has_value()) {
          status = backend.JoinOnDevice(*pending[m], stream_);
          pending[m].reset();
          if (!status.ok()) break;
        }
        status = AttentionHalf(li, mb, m + 1 == mbs.size(), prof);
        if (!status.ok()) break;
        absl::StatusOr<mlp::MlpBackend::Handle> h = backend.SubmitOnDevice(
            li, static_cast<char*>(normed_.data) + mb.row0 * row_bytes, mb.rows, mb.row0,
            static_cast<char*>(h_.data) + mb.row0 * row_bytes, stream_, absl::InfiniteFuture());
        if (!h.ok()) {
          status = absl::Status(
              h.status().code(),
              absl::StrFormat("layer %d MLP (micro-batch %d) on the %s backend: %s", li, m,
                              std::string(backend.name()), h.status().message()));
          break;
        }
        pending[m] = *h;
        if (prof != nullptr) status = prof->Mark("mlp_offload");
      }
    }
    for (auto& h : pending) {
      if (!h.has_value()) continue;
      absl::Status joined = backend.JoinOnDevice(*h, stream_);
      if (status.ok()) status = joined;
    }
    return status;
  }

  // Queues the whole forward pass of plan_ (metadata already on the device).
  absl::Status RunDevice(Profiler* prof) {
    const ModelConfig& c = config_;
    const StepPlan& p = plan_;
    void* s = stream_;
    const int32_t* meta = static_cast<const int32_t*>(meta_.data);
    const int T = p.num_rows, hidden = c.hidden_size;
    const int inter = c.intermediate_size;
    auto mark = [prof](const char* name) -> absl::Status {
      return prof == nullptr ? absl::OkStatus() : prof->Mark(name);
    };
    auto norm = [&](const void* x, void* residual, const void* weight, int rows) {
      cuda::RmsNormArgs a;
      a.x = x;
      a.residual = residual;
      a.weight = weight;
      a.out = normed_.data;
      a.rows = rows;
      a.dim = hidden;
      a.eps = c.rms_norm_eps;
      return cuda::LaunchRmsNorm(a, s);
    };

    RETURN_IF_ERROR(
        cuda::LaunchEmbedding(meta + p.off.ids, embed_, T, hidden, c.vocab_size, resid_.data, s));
    RETURN_IF_ERROR(mark("embedding"));
    step_micro_batches_ = 1;
    step_ping_pong_ = PingPongEligible();
    if (step_ping_pong_) {
      const int count = options_.mlp_micro_batches > 0 ? options_.mlp_micro_batches
                                                       : chooser_.Choose(p.num_decode);
      const std::vector<MicroBatch> mbs = PlanMicroBatches(count);
      if (mbs.size() > 1) {
        step_micro_batches_ = static_cast<int>(mbs.size());
        RETURN_IF_ERROR(PingPongLayers(mbs, prof));
      }
    }
    const MicroBatch whole{0, T, p.num_decode, p.num_prefill > 0};
    for (int li = 0; li < c.num_layers && step_micro_batches_ == 1; ++li) {
      const LayerPtrs& lw = layers_[li];
      RETURN_IF_ERROR(AttentionHalf(li, whole, /*last=*/true, prof));
      if (options_.mlp != nullptr) {
        RETURN_IF_ERROR(OffloadedMlp(li, T));
        RETURN_IF_ERROR(mark("mlp_offload"));
        continue;
      }
      if (gemm_->FusesGatedSilu(T, hidden, inter, normed_.data, lw.gate_up)) {
        // Decode-sized: one kernel (GEMV or skinny GEMM) computes gate and up and writes
        // silu(gate) * up.
        RETURN_IF_ERROR(
            gemm_->LinearGatedSilu(normed_.data, lw.gate_up, T, hidden, inter, act_.data, s));
        RETURN_IF_ERROR(mark("gate_up_silu_fused"));
      } else {
        RETURN_IF_ERROR(gemm_->Linear(normed_.data, lw.gate_up, nullptr, T, hidden, 2 * inter,
                                      gate_up_.data, GemmOut::kBf16, s));
        RETURN_IF_ERROR(mark("gate_up_gemm"));
        RETURN_IF_ERROR(cuda::LaunchSiluMul(gate_up_.data, T, inter, act_.data, s));
        RETURN_IF_ERROR(mark("silu_mul"));
      }
      RETURN_IF_ERROR(
          gemm_->Linear(act_.data, lw.down, nullptr, T, inter, hidden, h_.data, GemmOut::kBf16, s));
      RETURN_IF_ERROR(mark("down_gemm"));
    }
    RETURN_IF_ERROR(norm(h_.data, resid_.data, final_norm_, T));
    RETURN_IF_ERROR(mark("final_norm"));
    const int R = p.num_logit_rows;
    if (R > 0) {
      // Gathering rows is an embedding lookup with the normed activations as the table.
      RETURN_IF_ERROR(cuda::LaunchEmbedding(meta + p.off.logit_rows, normed_.data, R, hidden, T,
                                            last_.data, s));
      RETURN_IF_ERROR(mark("gather"));
      RETURN_IF_ERROR(gemm_->Linear(last_.data, lm_head_, nullptr, R, hidden, c.vocab_size,
                                    logits_.data, GemmOut::kF32, s));
      RETURN_IF_ERROR(mark("lm_head"));
    }
    if (SampleInGraph()) {
      RETURN_IF_ERROR(LaunchSamplingRows(s));
      RETURN_IF_ERROR(mark("sampling"));
    }
    return absl::OkStatus();
  }

  const ModelConfig config_;
  const CudaRunnerOptions options_;
  std::unique_ptr<Device> device_;  // owns every DeviceBuffer below and the stream
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CublasLtGemm> gemm_;

  DeviceBuffer weights_;
  size_t weight_bytes_ = 0;
  const void* embed_ = nullptr;
  const void* final_norm_ = nullptr;
  const void* lm_head_ = nullptr;
  std::vector<LayerPtrs> layers_;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t upload_events_[2] = {nullptr, nullptr};

  DeviceBuffer kv_;
  int num_blocks_ = 0;
  KvCacheLayout layout_;
  KvHostMirror mirror_;  // transfer_layout()
  // Layer progress (EnableKvProgress): pinned mapped host memory, its device address, the last
  // value launched; capturing_ while RunDevice records a graph.
  uint64_t* progress_host_ = nullptr;
  uint64_t* progress_device_ = nullptr;
  uint64_t progress_value_ = 0;
  bool capturing_ = false;
  // Ping-pong (MLP offload): whether the last step could run in micro-batches, how many it ran,
  // and the chooser of that count when options_.mlp_micro_batches is 0.
  bool step_ping_pong_ = false;
  int step_micro_batches_ = 1;
  mlp::MicroBatchChooser chooser_;
  cuda::PagedKvCache cache_;
  DeviceBuffer inv_freq_;
  DeviceBuffer cublas_ws_;

  Capacity cap_;
  DeviceBuffer resid_, normed_, h_, qkv_, attn_, gate_up_, act_;  // [cap_.rows, ...] bf16
  DeviceBuffer last_;                                             // [cap_.logit_rows, hidden]
  DeviceBuffer logits_;                                           // [cap_.logit_rows, vocab] f32
  DeviceBuffer meta_;                                             // [cap_.meta] int32
  DeviceBuffer decode_ws_;
  int32_t* host_meta_ = nullptr;  // pinned, [cap_.meta]
  // MLP offload (options_.mlp): pinned [2][cap_.rows, hidden] bf16 (down, up) and the float32
  // rows the backend reads and writes.
  void* host_mlp_ = nullptr;
  std::vector<float> mlp_x_, mlp_y_;

  // Device sampling: [cap_.logit_rows] SamplingRow, then the packed tokens/logprobs at
  // sampling_out_offset_ (Grow); host_sampling_ is its pinned host twin.
  DeviceBuffer sampling_;
  void* host_sampling_ = nullptr;
  size_t sampling_out_offset_ = 0;
  bool sample_step_ = false;  // this step samples on the GPU (UploadSampling)
  bool masked_step_ = false;  // ... and some row under a grammar mask (SampleMasked)
  // Grammar masks, flags and log-sum-exps (layout in Grow); host_mask_ is the pinned twin of the
  // masks and flags.
  DeviceBuffer mask_;
  void* host_mask_ = nullptr;
  size_t mask_flags_offset_ = 0;
  size_t mask_lse_offset_ = 0;

  StepPlan plan_;
  CudaStepStats stats_;
  std::map<GraphKeyType, cudaGraphExec_t> graphs_;
  std::set<GraphKeyType> failed_graphs_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CreateCudaModelRunner(
    const ModelConfig& config, const TensorStore& store, const CudaRunnerOptions& options) {
  RETURN_IF_ERROR(ValidateConfig(config));
  if (options.block_size <= 0 || options.max_batch_tokens <= 0 || options.device_ordinal < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("CUDA runner: block_size %d, max_batch_tokens %d and device %d must be "
                        "positive (device >= 0)",
                        options.block_size, options.max_batch_tokens, options.device_ordinal));
  }
  if (options.mlp != nullptr) {
    const mlp::MlpShape s = options.mlp->shape();
    if (s.first_layer != 0 || s.end_layer != config.num_layers ||
        s.hidden_size != config.hidden_size || s.intermediate_size != config.intermediate_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "CUDA runner: the %s MLP backend serves layers %d:%d of hidden %d, intermediate %d; the "
          "model has %d layers of hidden %d, intermediate %d",
          std::string(options.mlp->name()), s.first_layer, s.end_layer, s.hidden_size,
          s.intermediate_size, config.num_layers, config.hidden_size, config.intermediate_size));
    }
  }
  if (options.mlp_micro_batches < 0 || options.mlp_micro_batches > 16) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA runner: mlp_micro_batches %d (0: chosen from measured step times, 1-16: fixed)",
        options.mlp_micro_batches));
  }
  // Before anything is allocated: a plan filled in code gets the parser's range checks.
  RETURN_IF_ERROR(ValidateCudaTuning(options.tuning));
  auto runner = std::make_unique<Runner>(config, options);
  RETURN_IF_ERROR(runner->Init(store));
  return std::unique_ptr<CudaModelRunner>(std::move(runner));
}

}  // namespace tandem
