// decode_gemm_bench: the decode projections of a model shape at a few batch sizes, on cuBLASLt
// (CublasLtGemm, autotuned as in the runner) and on the cluster GEMM (cluster_gemm.h) with its
// default plan and every other plan that fits one wave, against the copy bandwidth measured in
// the same run.
//   decode_gemm_bench [--shapes qkv=6144x4096,o=4096x4096,gate_up=28672x4096,down=4096x14336]
//                     [--rows 33,48,64] [--layers 32] [--iters 20] [--json FILE]
//                     [--plans 128x2,...] [--skip-cublaslt] [--trace] [--stages N]
//                     [--tuning KEY=VALUE,...]
// --plans keeps only those cluster GEMM plans (TILExSPLITS); --skip-cublaslt leaves cuBLASLt out
// (both for profiling one kernel). --tuning is the GEMM plan of the cuBLASLt rows
// (runtime/model/cuda/cuda_tuning.h, docs/tuning.md; default cluster=off,skinny=off, so that
// cuBLASLt takes them; e.g. autotune.candidates=32,autotune.splitk=1 widens its search). --trace
// also replays each cluster plan's graph with the kernel's per-CTA timestamps on
// (ClusterGemmArgs::trace) and prints, averaged over the layers after the first: how long a launch
// spans (first CTA in to last CTA out), the gap from the previous launch's last CTA out to this
// one's first CTA in (negative: they overlap), and per CTA the time to the programmatic wait's
// return, to the first stage, the main loop, the epilogue, and the spread of the main loops' ends.
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
#include "runtime/model/cuda/cuda_tuning.h"

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

// Summarizes trace records [layer][cta][kClusterGemmTraceWords] (see the file comment).
void PrintTrace(const std::vector<uint64_t>& t, int layers, int ctas) {
  constexpr int W = cuda::kClusterGemmTraceWords;
  auto at = [&](int l, int c, int i) {
    return static_cast<double>(t[(size_t(l) * ctas + c) * W + i]);
  };
  double span = 0, gap = 0, wait = 0, first = 0, main = 0, epi = 0, spread = 0;
  int n = 0;
  double prev_end = 0;
  for (int l = 0; l < layers; ++l) {
    double start = 1e300, end = 0, main_lo = 1e300, main_hi = 0;
    double w = 0, f = 0, mn = 0, e = 0;
    for (int c = 0; c < ctas; ++c) {
      start = std::min(start, at(l, c, 0));
      end = std::max(end, at(l, c, 5));
      main_lo = std::min(main_lo, at(l, c, 3));
      main_hi = std::max(main_hi, at(l, c, 3));
      w += at(l, c, 1) - at(l, c, 0);
      f += at(l, c, 2) - at(l, c, 0);
      mn += at(l, c, 3) - at(l, c, 2);
      e += at(l, c, 5) - at(l, c, 3);
    }
    if (l > 0) {
      span += end - start;
      gap += start - prev_end;
      wait += w / ctas;
      first += f / ctas;
      main += mn / ctas;
      epi += e / ctas;
      spread += main_hi - main_lo;
      ++n;
    }
    prev_end = end;
  }
  if (n == 0) return;
  std::printf(
      "        trace (us, mean of %d launches): span %.2f, gap %+.2f; per CTA: wait %.2f, "
      "first stage %.2f, main loop %.2f, epilogue %.2f; main-loop ends spread %.2f\n",
      n, span / n / 1e3, gap / n / 1e3, wait / n / 1e3, first / n / 1e3, main / n / 1e3,
      epi / n / 1e3, spread / n / 1e3);
}

struct Options {
  std::vector<int> rows;
  int layers = 32, iters = 20;
  std::string json_path;
  std::vector<std::string> plans;  // empty: every plan
  bool skip_cublaslt = false;
  bool trace = false;
  int stages = 0;
  GemmTuning tuning;  // of the CublasLtGemm that times the cuBLASLt rows
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
                   cuda_runner::CublasLtGemm::Create(workspace, kWorkspace, o.tuning));
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
        // Launch of layer l's projection, with its trace records at `trace` when not null.
        auto launch = [&](int l, uint64_t* trace) {
          cuda::ClusterGemmArgs a;
          a.x = x;
          a.w = w_of(l);
          a.out = y;
          a.m = m;
          a.n = s.n;
          a.k = s.k;
          a.stages = o.stages;
          a.trace = trace;
          return cuda::LaunchClusterGemm(a, p, stream);
        };
        ASSIGN_OR_RETURN(const double us, TimeGraph(stream, layers, iters,
                                                    [&](int l) { return launch(l, nullptr); }));
        report(absl::StrCat("cluster ", p.tile_rows, "x", p.splits,
                            &p == &plans[0] && def.ok() ? " (default)" : ""),
               us);
        if (o.trace) {
          const int ctas = p.tiles * p.splits;
          const size_t words = size_t(layers) * ctas * cuda::kClusterGemmTraceWords;
          uint64_t* trace = nullptr;
          RETURN_IF_CUDA_ERROR(cudaMalloc(reinterpret_cast<void**>(&trace), words * 8), "trace");
          ASSIGN_OR_RETURN(const double traced_us, TimeGraph(stream, layers, 1, [&](int l) {
                             return launch(l,
                                           trace + size_t(l) * ctas * cuda::kClusterGemmTraceWords);
                           }));
          std::vector<uint64_t> host(words);
          RETURN_IF_CUDA_ERROR(cudaMemcpy(host.data(), trace, words * 8, cudaMemcpyDeviceToHost),
                               "trace copy");
          cudaFree(trace);
          std::printf("        traced replay %.2f us per launch\n", traced_us);
          PrintTrace(host, layers, ctas);
        }
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
  app.add_flag("--trace", o.trace, "per-CTA timeline of each cluster plan");
  app.add_option("--stages", o.stages, "cluster GEMM pipeline stages (0: as many as fit)")
      ->check(CLI::Range(0, 16));
  std::string tuning = "cluster=off,skinny=off";
  app.add_option("--tuning", tuning,
                 "GEMM plan of the cuBLASLt rows, key=value[,key=value...] (docs/tuning.md)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  absl::StatusOr<tandem::CudaTuning> parsed_tuning = tandem::ParseCudaTuning(tuning);
  if (!parsed_tuning.ok()) {
    std::fprintf(stderr, "decode_gemm_bench: --tuning: %s\n",
                 std::string(parsed_tuning.status().message()).c_str());
    return 2;
  }
  o.tuning = parsed_tuning->gemm;
  absl::StatusOr<std::vector<tandem::Shape>> parsed = tandem::ParseShapes(shapes);
  absl::Status st = parsed.ok() ? tandem::Run(*parsed, o) : parsed.status();
  if (!st.ok()) {
    std::fprintf(stderr, "decode_gemm_bench: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  return 0;
}
