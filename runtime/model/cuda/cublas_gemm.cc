#include "runtime/model/cuda/cublas_gemm.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "runtime/base/logging.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/cluster_gemm.h"
#include "runtime/kernels/cuda/gemv_kernels.h"
#include "runtime/kernels/cuda/skinny_gemm.h"

namespace tandem::cuda_runner {
namespace {

absl::Status CublasStatus(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cublasLtGetStatusName(s), ": ", cublasLtGetStatusString(s));
  switch (s) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return absl::InvalidArgumentError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return absl::UnavailableError(message);
    default:
      return absl::InternalError(message);
  }
}

#define RETURN_IF_CUBLAS(expr, what)                      \
  do {                                                    \
    const cublasStatus_t _tandem_cublas_status = (expr);  \
    if (_tandem_cublas_status != CUBLAS_STATUS_SUCCESS) { \
      return CublasStatus(_tandem_cublas_status, what);   \
    }                                                     \
  } while (0)

// Descriptors and algorithm of one GEMM shape.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void Destroy() {
    if (desc != nullptr) cublasLtMatmulDescDestroy(desc);
    for (cublasLtMatrixLayout_t l : {a, b, c}) {
      if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
    }
  }
};

using Key = std::tuple<int, int, int, bool, int>;  // m, k, n, bias, out type

// Shapes cached at most; prefill token counts vary, so the cache is flushed when it fills.
constexpr size_t kMaxPlans = 2048;
// Autotuning: which row counts are timed (decode buckets, and chunk-sized prefills; other prefill
// sizes vary too much to time every new one). The candidates asked of the heuristic are
// GemmTuning::autotune_candidates.
// Split-K counts tried on top of each candidate that supports split-K and has none
// (GemmTuning::autotune_splitk).
constexpr int kSplitKCounts[] = {2, 3, 4, 6, 8};
constexpr int kAutotuneMaxRows = 256;
// Prefill chunks of a whole number of these rows (the scheduler's token budgets: 512, 2048, 8192,
// ...) recur too, so they are timed as well (once per shape, a few hundred ms for the largest).
constexpr int kAutotuneChunkRows = 512;
constexpr size_t kFlushBytes = size_t{128} << 20;
// Split-K scratch of the skinny GEMM: the largest plan of a Llama-3-8B-sized decode projection at
// 64 rows needs 4 MiB of partials (O and down projections, 4 splits); shapes whose plan needs more
// go to cuBLASLt.
constexpr size_t kSkinnyPartialBytes = size_t{16} << 20;
constexpr size_t kSkinnyCounterBytes = size_t{64} << 10;
// Rows up to which the skinny GEMM takes calls by default (Hopper): on the H200 its wgmma kernel
// beat cuBLASLt at 8-32 rows (-10% to -2.5% per decode step) and lost at 64 (+6%)
// (bench/RESULTS.md, seventh session).
constexpr int kSkinnyDefaultMaxRows = 32;

bool WorthTuning(int m) { return m <= kAutotuneMaxRows || m % kAutotuneChunkRows == 0; }

// Autotuned algorithms of the process, per (device, shape, candidates asked, split-K variants).
using TunedKey = std::tuple<int, Key, int, bool>;

absl::Mutex& TunedMutex() {
  static absl::Mutex* mu = new absl::Mutex();
  return *mu;
}

absl::Status LaunchGemvFor(const void* x, const void* w, const void* bias, int m, int k, int n,
                           void* out, bool out_f32, bool gated_silu, void* stream) {
  cuda::GemvArgs a;
  a.x = x;
  a.w = w;
  a.bias = bias;
  a.out = out;
  a.out_f32 = out_f32;
  a.gated_silu = gated_silu;
  a.m = m;
  a.n = n;
  a.k = k;
  return cuda::LaunchGemv(a, stream);
}

absl::flat_hash_map<TunedKey, cublasLtMatmulAlgo_t>& TunedAlgos() {
  static auto* algos = new absl::flat_hash_map<TunedKey, cublasLtMatmulAlgo_t>();
  return *algos;
}

template <typename T>
T AlgoConfig(const cublasLtMatmulAlgo_t& algo, cublasLtMatmulAlgoConfigAttributes_t attr) {
  T v{};
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &v, sizeof(v), &written) !=
      CUBLAS_STATUS_SUCCESS) {
    return T{};
  }
  return v;
}

// "id/tile/stages/splitK/reduction/cluster" of an algorithm, for the autotuning log.
std::string DescribeAlgo(const cublasLtMatmulAlgo_t& algo) {
  return absl::StrCat(AlgoConfig<int32_t>(algo, CUBLASLT_ALGO_CONFIG_ID), "/tile",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_TILE_ID), "/stages",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_STAGES_ID), "/splitk",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM), "/red",
                      AlgoConfig<uint32_t>(algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME), "/cluster",
                      AlgoConfig<uint16_t>(algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID));
}

}  // namespace

struct CublasLtGemm::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int autotune_candidates = 0;   // asked of the heuristic (GemmTuning)
  bool autotune_splitk = false;  // also time split-K variants
  bool autotune_log = false;     // log each tuned shape's choice
  void* flush = nullptr;  // kFlushBytes of device scratch for autotuning, allocated on first use
  // Skinny GEMM (when Create enables it): the device's SM count and its split-K scratch, allocated
  // at Create (counters zeroed there; the kernel leaves them zero).
  bool skinny_enabled = false;
  int skinny_max_rows = 0;        // calls of 2..skinny_max_rows rows take it
  int skinny_qkv_max_rows = 0;    // the same for the QKV projection with RoPE fused
  int skinny_gated_max_rows = 0;  // the same for the gate/up projection with SiLU fused
  int num_sms = 0;
  int skinny_ctas_per_sm = cuda::kSkinnyGemmCtasPerSm;
  void* skinny_partials = nullptr;
  void* skinny_counters = nullptr;
  // Cluster GEMM (on by default on compute capability 9.0; ConfigureClusterGemm): calls of
  // min..max rows whose (n, k) has a plan on this device's capacity (and is listed, when a list
  // is given) take it; plans are made once per shape. The values are GemmTuning's.
  bool cluster_enabled = false;
  int cluster_min_rows = 0;
  int cluster_max_rows = 0;
  std::vector<std::pair<int, int>> cluster_shapes;  // (n, k); empty: every shape with a plan
  double cluster_min_fill = 0;                      // PlanClusterGemm's min_fill
  int cluster_stages = 0;                           // ClusterGemmArgs::stages
  int cluster_max_tile = 0;                         // PlanClusterGemm's max_tile_rows
  cuda::ClusterGemmCapacity cluster_capacity;
  absl::flat_hash_map<std::pair<int, int>, cuda::ClusterGemmPlan> cluster_plans;
  absl::flat_hash_map<Key, Plan> plans;

  ~Impl() {
    if (flush != nullptr) cudaFree(flush);
    if (skinny_partials != nullptr) cudaFree(skinny_partials);
    if (skinny_counters != nullptr) cudaFree(skinny_counters);
    Clear();
    if (handle != nullptr) cublasLtDestroy(handle);
  }
  void Clear() {
    for (auto& [key, plan] : plans) plan.Destroy();
    plans.clear();
  }

  // The plan of a shape; a new shape is built (and, see Autotune, timed on this very call's
  // operands) on its first call.
  absl::StatusOr<const Plan*> GetPlan(int m, int k, int n, const void* x, const void* w,
                                      const void* bias, void* out, GemmOut out_type,
                                      cudaStream_t stream) {
    const Key key{m, k, n, bias != nullptr, static_cast<int>(out_type)};
    if (auto it = plans.find(key); it != plans.end()) return &it->second;
    if (plans.size() >= kMaxPlans) Clear();
    Plan p;
    std::vector<cublasLtMatmulHeuristicResult_t> candidates;
    absl::Status s = Build(m, k, n, bias != nullptr, out_type, &p, &candidates);
    if (s.ok() && WorthTuning(m)) {
      if (autotune_splitk) AddSplitKVariants(p, &candidates);
      if (candidates.size() > 1) s = Autotune(key, p, candidates, x, w, bias, out, stream);
    }
    if (!s.ok()) {
      p.Destroy();
      return s;
    }
    return &plans.emplace(key, p).first->second;
  }

  // Picks the fastest of cuBLASLt's candidate algorithms for a decode-sized shape by timing each
  // on the call's own operands (they are rewritten by the real call right after). cuBLASLt's
  // first heuristic choice is tuned for compute-bound shapes; at 8-256 rows the projections are
  // weight-streaming and the best algorithm differs by up to ~30% (bench/RESULTS.md). Skipped
  // while the stream is being captured into a CUDA graph (timing needs a synchronization): the
  // heuristic's first choice is kept then.
  // The choice is shared by every CublasLtGemm of the process (per device, shape and autotune
  // settings), so two runners of one process with the same settings compute bit-identical GEMMs.
  absl::Status Autotune(const Key& key, Plan& p,
                        const std::vector<cublasLtMatmulHeuristicResult_t>& candidates,
                        const void* x, const void* w, const void* bias, void* out,
                        cudaStream_t stream) {
    int device = 0;
    if (cudaGetDevice(&device) != cudaSuccess) {
      cudaGetLastError();
      return absl::OkStatus();
    }
    const TunedKey tuned_key{device, key, autotune_candidates, autotune_splitk};
    {
      absl::MutexLock lock(&TunedMutex());
      if (auto it = TunedAlgos().find(tuned_key); it != TunedAlgos().end()) {
        p.algo = it->second;
        return absl::OkStatus();
      }
    }
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
        capture != cudaStreamCaptureStatusNone) {
      cudaGetLastError();
      return absl::OkStatus();
    }
    if (bias != nullptr) {
      RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)),
                       "set BIAS_POINTER");
    }
    if (flush == nullptr && cudaMalloc(&flush, kFlushBytes) != cudaSuccess) {
      flush = nullptr;
      cudaGetLastError();
      return absl::OkStatus();  // keep the heuristic's choice
    }
    cudaEvent_t start = nullptr, stop = nullptr;
    if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
      if (start != nullptr) cudaEventDestroy(start);
      cudaGetLastError();
      return absl::OkStatus();  // keep the heuristic's choice
    }
    const float alpha = 1.0f, beta = 0.0f;
    float best_ms = 0.0f, first_ms = 0.0f;
    int timed = 0;
    for (const cublasLtMatmulHeuristicResult_t& c : candidates) {
      // Each timed run starts with the L2 cache flushed (a 128 MiB memset, larger than any L2),
      // as in a decode step, where every layer's weights come from HBM; the best of kRuns counts.
      constexpr int kRuns = 5;
      bool ok = cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c,
                               &c.algo, workspace, workspace_bytes,
                               stream) == CUBLAS_STATUS_SUCCESS;  // warm-up
      float ms = 0.0f;
      for (int r = 0; ok && r < kRuns; ++r) {
        float one = 0.0f;
        ok = cudaMemsetAsync(flush, r, kFlushBytes, stream) == cudaSuccess &&
             cudaEventRecord(start, stream) == cudaSuccess &&
             cublasLtMatmul(handle, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c,
                            &c.algo, workspace, workspace_bytes, stream) == CUBLAS_STATUS_SUCCESS &&
             cudaEventRecord(stop, stream) == cudaSuccess &&
             cudaEventSynchronize(stop) == cudaSuccess &&
             cudaEventElapsedTime(&one, start, stop) == cudaSuccess;
        if (ok && (r == 0 || one < ms)) ms = one;
      }
      if (!ok) {
        cudaGetLastError();  // a candidate that fails to run is skipped
        continue;
      }
      if (timed++ == 0) first_ms = ms;
      if (best_ms == 0.0f || ms < best_ms) {
        best_ms = ms;
        p.algo = c.algo;
      }
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (best_ms > 0.0f) {
      absl::MutexLock lock(&TunedMutex());
      p.algo = TunedAlgos().emplace(tuned_key, p.algo).first->second;  // first writer wins
    }
    if (autotune_log && best_ms > 0.0f) {
      const auto [m, k, n, has_bias, out_type] = key;
      const double bytes = 2.0 * (double{1} * n * k + double{1} * m * k) +
                           (out_type == static_cast<int>(GemmOut::kBf16) ? 2.0 : 4.0) * m * n;
      LOG(INFO) << "GEMM autotune m=" << m << " k=" << k << " n=" << n << ": " << timed << " of "
                << candidates.size() << " candidates ran; best " << best_ms * 1e3 << " us ("
                << bytes / (best_ms * 1e-3) / 1e12 << " TB/s, " << DescribeAlgo(p.algo)
                << "), heuristic's first " << first_ms * 1e3 << " us";
    }
    return absl::OkStatus();
  }

  // Appends split-K variants of every candidate that supports split-K and has none: each count of
  // kSplitKCounts with a reduction in a workspace (float32 or output type; never in place, so the
  // result stays deterministic) that cuBLASLt accepts for the shape within our workspace.
  void AddSplitKVariants(const Plan& p, std::vector<cublasLtMatmulHeuristicResult_t>* candidates) {
    const size_t base_count = candidates->size();
    for (size_t i = 0; i < base_count; ++i) {
      const cublasLtMatmulAlgo_t base = (*candidates)[i].algo;
      int32_t splitk_support = 0;
      uint32_t schemes = 0;
      size_t written = 0;
      if (cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT,
                                            &splitk_support, sizeof(splitk_support),
                                            &written) != CUBLAS_STATUS_SUCCESS ||
          splitk_support == 0 ||
          cublasLtMatmulAlgoCapGetAttribute(&base, CUBLASLT_ALGO_CAP_REDUCTION_SCHEME_MASK,
                                            &schemes, sizeof(schemes),
                                            &written) != CUBLAS_STATUS_SUCCESS ||
          AlgoConfig<uint32_t>(base, CUBLASLT_ALGO_CONFIG_SPLITK_NUM) > 1) {
        continue;
      }
      uint32_t scheme = 0;
      for (const uint32_t s : {uint32_t{CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE},
                               uint32_t{CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE}}) {
        if ((schemes & s) != 0) {
          scheme = s;
          break;
        }
      }
      if (scheme == 0) continue;
      for (const uint32_t splits : kSplitKCounts) {
        cublasLtMatmulHeuristicResult_t v{};
        v.algo = base;
        if (cublasLtMatmulAlgoConfigSetAttribute(&v.algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splits,
                                                 sizeof(splits)) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoConfigSetAttribute(&v.algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME,
                                                 &scheme,
                                                 sizeof(scheme)) != CUBLAS_STATUS_SUCCESS ||
            cublasLtMatmulAlgoCheck(handle, p.desc, p.a, p.b, p.c, p.c, &v.algo, &v) !=
                CUBLAS_STATUS_SUCCESS ||
            v.workspaceSize > workspace_bytes) {
          continue;
        }
        candidates->push_back(v);
      }
    }
  }

  // Row-major out[m, n] = x[m, k] w[n, k]^T, seen column-major: C = out as [n, m] (ld n) =
  // op(A) B with A = w as [k, n] (ld k) transposed and B = x as [k, m] (ld k). The epilogue
  // bias is per row of C, i.e. per output feature.
  absl::Status Build(int m, int k, int n, bool bias, GemmOut out_type, Plan* p,
                     std::vector<cublasLtMatmulHeuristicResult_t>* candidates) {
    const cudaDataType_t out_dt = out_type == GemmOut::kBf16 ? CUDA_R_16BF : CUDA_R_32F;
    RETURN_IF_CUBLAS(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                     "cublasLtMatmulDescCreate");
    const cublasOperation_t trans = CUBLAS_OP_T, no_trans = CUBLAS_OP_N;
    RETURN_IF_CUBLAS(
        cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)),
        "set TRANSA");
    RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &no_trans,
                                                    sizeof(no_trans)),
                     "set TRANSB");
    if (bias) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                      &epilogue, sizeof(epilogue)),
                       "set EPILOGUE");
      const cudaDataType_t bias_dt = CUDA_R_16BF;
      RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                      &bias_dt, sizeof(bias_dt)),
                       "set BIAS_DATA_TYPE");
    }
    RETURN_IF_CUBLAS(cublasLtMatrixLayoutCreate(&p->a, CUDA_R_16BF, k, n, k), "layout A");
    RETURN_IF_CUBLAS(cublasLtMatrixLayoutCreate(&p->b, CUDA_R_16BF, k, m, k), "layout B");
    RETURN_IF_CUBLAS(cublasLtMatrixLayoutCreate(&p->c, out_dt, n, m, n), "layout C");

    cublasLtMatmulPreference_t pref = nullptr;
    RETURN_IF_CUBLAS(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws = workspace_bytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    candidates->assign(autotune_candidates, cublasLtMatmulHeuristicResult_t{});
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(handle, p->desc, p->a, p->b, p->c, p->c, pref,
                                       autotune_candidates, candidates->data(), &found);
    cublasLtMatmulPreferenceDestroy(pref);
    RETURN_IF_CUBLAS(s, "cublasLtMatmulAlgoGetHeuristic");
    if (found == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "cuBLASLt has no algorithm for bf16 GEMM m=", m, " k=", k, " n=", n, " bias=", bias));
    }
    candidates->resize(found);
    p->algo = candidates->front().algo;
    return absl::OkStatus();
  }
};

CublasLtGemm::CublasLtGemm(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CublasLtGemm::~CublasLtGemm() = default;

absl::StatusOr<std::unique_ptr<CublasLtGemm>> CublasLtGemm::Create(void* workspace,
                                                                   size_t workspace_bytes,
                                                                   const GemmTuning& tuning) {
  CudaTuning whole;
  whole.gemm = tuning;
  RETURN_IF_ERROR(ValidateCudaTuning(whole));
  auto impl = std::make_unique<Impl>();
  RETURN_IF_CUBLAS(cublasLtCreate(&impl->handle), "cublasLtCreate");
  impl->workspace = workspace;
  impl->workspace_bytes = workspace_bytes;
  impl->autotune_candidates = tuning.autotune_candidates;
  impl->autotune_splitk = tuning.autotune_splitk;
  impl->autotune_log = tuning.autotune_log;
  // The skinny GEMM: by default (kAuto) on compute capability 9.0 (its wgmma kernel) for 2-32
  // rows; kOn on any GPU for 2-64 rows, kOff nowhere; skinny_max_rows bounds it.
  bool wanted = false;
  int default_rows = kSkinnyDefaultMaxRows;
  switch (tuning.skinny) {
    case GemmTuning::Skinny::kAuto:
      wanted = cuda::SkinnyGemmUsesWgmma();
      break;
    case GemmTuning::Skinny::kOff:
      break;
    case GemmTuning::Skinny::kOn:
      wanted = true;
      default_rows = cuda::kSkinnyGemmMaxRows;
      break;
  }
  impl->skinny_max_rows = tuning.skinny_max_rows != 0 ? tuning.skinny_max_rows : default_rows;
  impl->skinny_qkv_max_rows =
      tuning.skinny_qkv_max_rows != 0 ? tuning.skinny_qkv_max_rows : impl->skinny_max_rows;
  impl->skinny_gated_max_rows =
      tuning.skinny_gated_max_rows != 0 ? tuning.skinny_gated_max_rows : impl->skinny_max_rows;
  if (wanted) {
    int device = 0;
    RETURN_IF_CUDA_ERROR(cudaGetDevice(&device), "cudaGetDevice");
    RETURN_IF_CUDA_ERROR(
        cudaDeviceGetAttribute(&impl->num_sms, cudaDevAttrMultiProcessorCount, device),
        "cudaDeviceGetAttribute(MultiProcessorCount)");
    RETURN_IF_CUDA_ERROR(cudaMalloc(&impl->skinny_partials, kSkinnyPartialBytes),
                         "cudaMalloc(skinny GEMM partials)");
    RETURN_IF_CUDA_ERROR(cudaMalloc(&impl->skinny_counters, kSkinnyCounterBytes),
                         "cudaMalloc(skinny GEMM counters)");
    RETURN_IF_CUDA_ERROR(cudaMemset(impl->skinny_counters, 0, kSkinnyCounterBytes),
                         "cudaMemset(skinny GEMM counters)");
    impl->skinny_ctas_per_sm = tuning.skinny_ctas_per_sm;
    impl->skinny_enabled = true;
  }
  // The cluster GEMM (on by default where it runs, compute capability 9.0): it measured 1.9% off
  // the Llama-3-8B decode step at batch 48 and 64 on the H200 (bench/RESULTS.md, twelfth
  // session). Its default 64-row tiles are the 8B O and down projections' two-split plans that
  // measured faster in the step; wider tiles streamed slower than cuBLASLt in decode_gemm_bench
  // and slowed Llama-3.2-1B's gate/up projection 3.8%. The tests set min_fill 0 so that small
  // models take it.
  impl->cluster_min_rows = tuning.cluster_min_rows;
  impl->cluster_max_rows = tuning.cluster_max_rows;
  impl->cluster_shapes = tuning.cluster_shapes;
  impl->cluster_min_fill = tuning.cluster_min_fill;
  impl->cluster_max_tile = tuning.cluster_max_tile;
  impl->cluster_stages = tuning.cluster_stages;
  if (tuning.cluster && cuda::ClusterGemmRunsHere()) {
    impl->cluster_capacity = cuda::ClusterGemmCapacityHere();
    impl->cluster_enabled = true;
  }
  return std::unique_ptr<CublasLtGemm>(new CublasLtGemm(std::move(impl)));
}

absl::Status CublasLtGemm::Linear(const void* x, const void* w, const void* bias, int m, int k,
                                  int n, void* out, GemmOut out_type, void* stream) {
  if (m < 0 || k <= 0 || n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("GEMM shape m=", m, " k=", k, " n=", n, " is not valid"));
  }
  if (m == 0) return absl::OkStatus();
  if (x == nullptr || w == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("GEMM x, w and out must not be null");
  }
  if (bias != nullptr && out_type != GemmOut::kBf16) {
    return absl::InvalidArgumentError("GEMM bias is supported with bf16 output only");
  }
  if (UseSkinny(m, n, k, x, w, /*gated_silu=*/false)) {
    return LaunchSkinny(x, w, bias, m, k, n, out, out_type == GemmOut::kF32, false, stream);
  }
  if (UseGemv(m, k, x, w)) {
    return LaunchGemvFor(x, w, bias, m, k, n, out, out_type == GemmOut::kF32, false, stream);
  }
  if (const cuda::ClusterGemmPlan* cp = ClusterPlan(m, n, k, x, w, out, bias)) {
    cuda::ClusterGemmArgs a;
    a.x = x;
    a.w = w;
    a.bias = bias;
    a.out = out;
    a.out_f32 = out_type == GemmOut::kF32;
    a.m = m;
    a.n = n;
    a.k = k;
    a.stages = impl_->cluster_stages;
    return cuda::LaunchClusterGemm(a, *cp, stream);
  }
  auto plan_or =
      impl_->GetPlan(m, k, n, x, w, bias, out, out_type, static_cast<cudaStream_t>(stream));
  if (!plan_or.ok()) return plan_or.status();
  const Plan& p = **plan_or;
  if (bias != nullptr) {
    RETURN_IF_CUBLAS(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof(bias)),
                     "set BIAS_POINTER");
  }
  const float alpha = 1.0f, beta = 0.0f;
  RETURN_IF_CUBLAS(cublasLtMatmul(impl_->handle, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c,
                                  out, p.c, &p.algo, impl_->workspace, impl_->workspace_bytes,
                                  static_cast<cudaStream_t>(stream)),
                   "cublasLtMatmul");
  return absl::OkStatus();
}

absl::Status CublasLtGemm::LinearGatedSilu(const void* x, const void* w, int m, int k, int n,
                                           void* out, void* stream) {
  if (m < 0 || k <= 0 || n <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("gated GEMM shape m=", m, " k=", k, " n=", n, " is not valid"));
  }
  if (m == 0) return absl::OkStatus();
  if (x == nullptr || w == nullptr || out == nullptr) {
    return absl::InvalidArgumentError("gated GEMM x, w and out must not be null");
  }
  if (UseSkinny(m, n, k, x, w, /*gated_silu=*/true)) {
    return LaunchSkinny(x, w, nullptr, m, k, n, out, false, true, stream);
  }
  if (UseGemv(m, k, x, w)) {
    return LaunchGemvFor(x, w, nullptr, m, k, n, out, false, true, stream);
  }
  return absl::InvalidArgumentError(absl::StrCat("gated GEMM m=", m, " k=", k, " n=", n,
                                                 " has no fused kernel (check FusesGatedSilu)"));
}

bool CublasLtGemm::FusesGatedSilu(int m, int k, int n, const void* x, const void* w) const {
  return UseSkinny(m, n, k, x, w, /*gated_silu=*/true) || UseGemv(m, k, x, w);
}

const cuda::ClusterGemmPlan* CublasLtGemm::ClusterPlan(int m, int n, int k, const void* x,
                                                       const void* w, const void* out,
                                                       const void* bias) const {
  Impl& impl = *impl_;
  if (!impl.cluster_enabled || m < impl.cluster_min_rows || m > impl.cluster_max_rows ||
      !cuda::ClusterGemmSupports(m, n, k, x, w, out, bias)) {
    return nullptr;
  }
  if (!impl.cluster_shapes.empty() &&
      std::find(impl.cluster_shapes.begin(), impl.cluster_shapes.end(), std::make_pair(n, k)) ==
          impl.cluster_shapes.end()) {
    return nullptr;
  }
  auto it = impl.cluster_plans.find(std::make_pair(n, k));
  if (it == impl.cluster_plans.end()) {
    it = impl.cluster_plans
             .emplace(std::make_pair(n, k),
                      cuda::PlanClusterGemm(n, k, impl.cluster_capacity, impl.cluster_min_fill,
                                            impl.cluster_max_tile))
             .first;
  }
  return it->second.ok() ? &it->second : nullptr;
}

bool CublasLtGemm::UseSkinny(int m, int n, int k, const void* x, const void* w,
                             bool gated_silu) const {
  // One row stays on the GEMV (bench/RESULTS.md: it streams the large matrices at 4.1-4.2 TB/s).
  const int max_rows = gated_silu ? impl_->skinny_gated_max_rows : impl_->skinny_max_rows;
  if (!impl_->skinny_enabled || m < 2 || m > max_rows || !cuda::SkinnyGemmSupports(m, n, k, x, w)) {
    return false;
  }
  return SkinnyScratchFits(
      cuda::PlanSkinnyGemm(m, n, k, gated_silu, impl_->num_sms, impl_->skinny_ctas_per_sm));
}

bool CublasLtGemm::SkinnyScratchFits(const cuda::SkinnyGemmPlan& plan) const {
  return plan.partial_bytes <= kSkinnyPartialBytes && plan.counter_bytes <= kSkinnyCounterBytes;
}

bool CublasLtGemm::FusesQkvRope(int m, int k, int n, const void* x, const void* w) const {
  if (!impl_->skinny_enabled || m < 2 || m > impl_->skinny_qkv_max_rows || n % 2 != 0 ||
      !cuda::SkinnyGemmSupports(m, n, k, x, w)) {
    return false;
  }
  return SkinnyScratchFits(
      cuda::PlanSkinnyGemmRope(m, n, k, impl_->num_sms, impl_->skinny_ctas_per_sm));
}

absl::Status CublasLtGemm::LinearQkvRope(const void* x, const void* w, const void* bias, int m,
                                         int k, int n, const cuda::SkinnyRope& rope, void* out,
                                         void* stream) {
  if (m == 0) return absl::OkStatus();
  if (!FusesQkvRope(m, k, n, x, w)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "QKV GEMM m=", m, " k=", k, " n=", n, " has no fused RoPE kernel (check FusesQkvRope)"));
  }
  return LaunchSkinny(x, w, bias, m, k, n, out, false, false, stream, &rope);
}

absl::Status CublasLtGemm::LaunchSkinny(const void* x, const void* w, const void* bias, int m,
                                        int k, int n, void* out, bool out_f32, bool gated_silu,
                                        void* stream, const cuda::SkinnyRope* rope) {
  cuda::SkinnyGemmArgs a;
  a.x = x;
  a.w = w;
  a.bias = bias;
  a.out = out;
  a.out_f32 = out_f32;
  a.gated_silu = gated_silu;
  a.m = m;
  a.n = n;
  a.k = k;
  a.num_sms = impl_->num_sms;
  a.ctas_per_sm = impl_->skinny_ctas_per_sm;
  a.partials = impl_->skinny_partials;
  a.partials_bytes = kSkinnyPartialBytes;
  a.counters = impl_->skinny_counters;
  a.counters_bytes = kSkinnyCounterBytes;
  a.rope = rope;
  return cuda::LaunchSkinnyGemm(a, stream);
}

bool CublasLtGemm::UseGemv(int m, int k, const void* x, const void* w) const {
  // Measured on an H200 (bench/RESULTS.md, 2026-11-29, Llama-3-8B decode at 1K): the GEMV is on
  // par with cuBLASLt at one row (4.97 vs 5.04 ms/step) and much slower at eight (8.96 vs 5.26),
  // so only single-row projections take it until the kernel stages activations in shared memory.
  constexpr int kGemvRowsWorthIt = 1;
  return m <= kGemvRowsWorthIt && cuda::GemvSupports(m, k, x, w);
}

}  // namespace tandem::cuda_runner
