// decode_gemm_bench: the decode projections of a model shape at a few batch sizes, on cuBLASLt
// (CublasLtGemm, autotuned as in the runner) and on the cluster GEMM (cluster_gemm.h) with its
// default plan and every other plan that fits one wave, against the copy bandwidth measured in
// the same run.
//   decode_gemm_bench [--shapes qkv=6144x4096,o=4096x4096,gate_up=28672x4096,down=4096x14336]
//                     [--rows 33,48,64] [--layers 32] [--iters 20] [--json FILE]
//                     [--plans 128x2,...] [--skip-cublaslt]
// --plans keeps only those cluster GEMM plans (TILExSPLITS); --skip-cublaslt leaves cuBLASLt out
// (both for profiling one kernel).
// Each measurement is a CUDA graph of `layers` launches of one projection, each over its own
// weight copy (32 x the weights is far more than the L2, so every launch streams from HBM as in a
// step), replayed `iters` times after a warm-up; time per launch = graph time / layers (the
// median of 5 timed replays of iters each). Launches follow each other as in a step (programmatic
// edges where the launcher sets them), with the same activations.
// Prints one table per shape; --json writes every number. Exit status 0, or 1 with a message.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "nlohmann/json.hpp"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/kernels/cuda/cluster_gemm.h"
#include "runtime/model/cuda/cublas_gemm.h"

namespace tandem {
namespace {

using json = nlohmann::json;

struct Shape {
  std::string name;
  int n = 0, k = 0;
};

absl::StatusOr<std::vector<Shape>> ParseShapes(const std::string& text) {
  std::vector<Shape> out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::vector<absl::string_view> nv = absl::StrSplit(item, '=');
    std::vector<absl::string_view> nk =
        nv.size() == 2 ? absl::StrSplit(nv[1], 'x') : std::vector<absl::string_view>{};
    Shape s;
    if (nv.size() != 2 || nk.size() != 2 || !absl::SimpleAtoi(nk[0], &s.n) ||
        !absl::SimpleAtoi(nk[1], &s.k) || s.n <= 0 || s.k <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--shapes: expected NAME=NxK items, got \"", item, "\""));
    }
    s.name = std::string(nv[0]);
    out.push_back(s);
  }
  if (out.empty()) return absl::InvalidArgumentError("--shapes is empty");
  return out;
}

// Copy bandwidth (read + write bytes / time) of a 1 GiB device-to-device cudaMemcpy, best of 10.
absl::StatusOr<double> CopyBandwidth(cudaStream_t stream) {
  constexpr size_t kBytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&a, kBytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&b, kBytes), "cudaMalloc");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    cudaEventRecord(e0, stream);
    cudaMemcpyAsync(b, a, kBytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(e1, stream);
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(e1), "copy");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    best = std::min(best, ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * kBytes / (best * 1e-3);
}

// Captures `layers` calls of launch(layer) into a graph and returns the median microseconds per
// launch over 5 timings of `iters` replays.
absl::StatusOr<double> TimeGraph(cudaStream_t stream, int layers, int iters,
                                 const std::function<absl::Status(int)>& launch) {
  for (int l = 0; l < layers; ++l) RETURN_IF_ERROR(launch(l));  // eager warm-up (autotune)
  RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream), "warm-up");
  cudaGraph_t graph = nullptr;
  RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                       "begin capture");
  absl::Status st = absl::OkStatus();
  for (int l = 0; l < layers && st.ok(); ++l) st = launch(l);
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  RETURN_IF_ERROR(st);
  RETURN_IF_CUDA_ERROR(end, "end capture");
  cudaGraphExec_t exec = nullptr;
  RETURN_IF_CUDA_ERROR(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; i < 3; ++i) cudaGraphLaunch(exec, stream);
  std::vector<double> us;
  for (int t = 0; t < 5; ++t) {
    cudaEventRecord(e0, stream);
    for (int i = 0; i < iters; ++i) cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    RETURN_IF_CUDA_ERROR(cudaEventSynchronize(e1), "replay");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    us.push_back(1e3 * ms / iters / layers);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(us.begin(), us.end());
  return us[2];
}

struct Options {
  std::vector<int> rows;
  int layers = 32, iters = 20;
  std::string json_path;
  std::vector<std::string> plans;  // empty: every plan
  bool skip_cublaslt = false;
};

absl::Status Run(const std::vector<Shape>& shapes, const Options& o) {
  const std::vector<int>& rows = o.rows;
  const int layers = o.layers, iters = o.iters;
  const std::string& json_path = o.json_path;
  cudaStream_t stream;
  RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  ASSIGN_OR_RETURN(const double copy_bw, CopyBandwidth(stream));
  cudaDeviceProp prop;
  RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, 0), "properties");
  const cuda::ClusterGemmCapacity cap = cuda::ClusterGemmCapacityHere();
  std::printf(
      "%s, %d SMs; copy bandwidth %.2f TB/s; clusters held at once: %d x1, %d x2, %d x4, "
      "%d x8\n",
      prop.name, prop.multiProcessorCount, copy_bw / 1e12, cap.For(1), cap.For(2), cap.For(4),
      cap.For(8));
  json out = {
      {"device", prop.name}, {"copy_bandwidth", copy_bw}, {"layers", layers}, {"iters", iters}};
  out["capacity"] = {cap.For(1), cap.For(2), cap.For(4), cap.For(8)};
  constexpr size_t kWorkspace = size_t{32} << 20;
  void* workspace = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&workspace, kWorkspace), "workspace");
  ASSIGN_OR_RETURN(std::unique_ptr<cuda_runner::CublasLtGemm> gemm,
                   cuda_runner::CublasLtGemm::Create(workspace, kWorkspace));
  const int max_m = *std::max_element(rows.begin(), rows.end());
  for (const Shape& s : shapes) {
    const size_t w_bytes = size_t{2} * s.n * s.k;
    void* weights = nullptr;
    void *x = nullptr, *y = nullptr;
    RETURN_IF_CUDA_ERROR(cudaMalloc(&weights, w_bytes * layers), "weights");
    RETURN_IF_CUDA_ERROR(cudaMalloc(&x, size_t{2} * max_m * s.k), "x");
    RETURN_IF_CUDA_ERROR(cudaMalloc(&y, size_t{2} * max_m * s.n), "y");
    // Small bf16 values (0x3c00-ish patterns): finite products, content irrelevant to timing.
    cudaMemset(weights, 0x3c, w_bytes * layers);
    cudaMemset(x, 0x3c, size_t{2} * max_m * s.k);
    auto w_of = [&](int l) { return static_cast<const char*>(weights) + w_bytes * l; };
    std::printf("\n%s: n=%d k=%d (%.1f MB of weights per launch, %.2f us at the copy bandwidth)\n",
                s.name.c_str(), s.n, s.k, w_bytes / 1e6, 1e6 * w_bytes / copy_bw);
    std::printf("  %-5s %-22s %9s %9s %8s\n", "rows", "kernel", "us", "TB/s", "of copy");
    json js = {{"n", s.n}, {"k", s.k}};
    for (const int m : rows) {
      auto report = [&](const std::string& what, double us) {
        const double bw = w_bytes / (us * 1e-6);
        std::printf("  %-5d %-22s %9.2f %9.2f %7.1f%%\n", m, what.c_str(), us, bw / 1e12,
                    100.0 * bw / copy_bw);
        js["rows"][std::to_string(m)][what] = us;
      };
      if (!o.skip_cublaslt) {
        ASSIGN_OR_RETURN(const double lt_us, TimeGraph(stream, layers, iters, [&](int l) {
                           return gemm->Linear(x, w_of(l), nullptr, m, s.k, s.n, y,
                                               cuda_runner::GemmOut::kBf16, stream);
                         }));
        report("cublaslt", lt_us);
      }
      const cuda::ClusterGemmPlan def = cuda::PlanClusterGemm(s.n, s.k, cap);
      std::vector<cuda::ClusterGemmPlan> plans;
      if (def.ok()) plans.push_back(def);
      for (const int splits : {1, 2, 4, 8}) {
        for (const int tile : {64, 128, 192, 256}) {
          const cuda::ClusterGemmPlan p = cuda::MakeClusterGemmPlan(s.n, s.k, tile, splits);
          if (!p.ok() || p.tiles > cap.For(splits) || p.tiles * splits < cap.For(1) / 2) continue;
          if (def.ok() && p.tile_rows == def.tile_rows && p.splits == def.splits) continue;
          plans.push_back(p);
        }
      }
      for (const cuda::ClusterGemmPlan& p : plans) {
        if (!o.plans.empty() &&
            std::find(o.plans.begin(), o.plans.end(), absl::StrCat(p.tile_rows, "x", p.splits)) ==
                o.plans.end()) {
          continue;
        }
        ASSIGN_OR_RETURN(const double us, TimeGraph(stream, layers, iters, [&](int l) {
                           cuda::ClusterGemmArgs a;
                           a.x = x;
                           a.w = w_of(l);
                           a.out = y;
                           a.m = m;
                           a.n = s.n;
                           a.k = s.k;
                           return cuda::LaunchClusterGemm(a, p, stream);
                         }));
        report(absl::StrCat("cluster ", p.tile_rows, "x", p.splits,
                            &p == &plans[0] && def.ok() ? " (default)" : ""),
               us);
      }
    }
    out["shapes"][s.name] = js;
    cudaFree(weights);
    cudaFree(x);
    cudaFree(y);
  }
  gemm.reset();
  cudaFree(workspace);
  cudaStreamDestroy(stream);
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << out.dump(2) << "\n";
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", json_path));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  CLI::App app("decode_gemm_bench: decode projections on cuBLASLt and on the cluster GEMM");
  std::string shapes = "qkv=6144x4096,o=4096x4096,gate_up=28672x4096,down=4096x14336";
  tandem::Options o;
  o.rows = {33, 48, 64};
  app.add_option("--shapes", shapes, "NAME=NxK,... (n output features, k input features)");
  app.add_option("--rows", o.rows, "activation rows (1-64)")
      ->delimiter(',')
      ->check(CLI::Range(1, 64));
  app.add_option("--layers", o.layers, "weight copies per graph")->check(CLI::Range(1, 256));
  app.add_option("--iters", o.iters, "graph replays per timing")->check(CLI::Range(1, 10000));
  app.add_option("--json", o.json_path, "write every number here");
  app.add_option("--plans", o.plans, "only these cluster GEMM plans (TILExSPLITS)")->delimiter(',');
  app.add_flag("--skip-cublaslt", o.skip_cublaslt, "leave cuBLASLt out");
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<std::vector<tandem::Shape>> parsed = tandem::ParseShapes(shapes);
  absl::Status st = parsed.ok() ? tandem::Run(*parsed, o) : parsed.status();
  if (!st.ok()) {
    std::fprintf(stderr, "decode_gemm_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
