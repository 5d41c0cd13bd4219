// engine_bench: the CUDA engine's step times beside their ceilings, measured in ONE run on the GPU
// it is given.
//   engine_bench --model DIR [--device N] [--json FILE] [--iters 50]
//                [--batches 1,8,64,256] [--contexts 1024,8192] [--prefill 512,2048,8192]
//                [--skip sampling,verify,prefill,profile,skinny-ab] [--block-size 16]
//                [--verify-batches 1,32] [--verify-k 0,1,2,4,8] [--tuning KEY=VALUE,...]
// --tuning: the runner's kernel plan (runtime/model/cuda/cuda_tuning.h, docs/tuning.md; a bad one
// fails at startup), recorded in the output with every number.
// Ceilings, measured first in the same process: device copy bandwidth (cudaMemcpy D2D of 1 GiB,
// read + write bytes / time) and cuBLASLt bf16 GEMM throughput at 8192^3 (f32 accumulation).
// Then, with the model loaded by the CUDA runner:
//  - decode: steady-state CUDA-graph replays (CUDA events over --iters steps) for every batch x
//    context whose KV fits, with the KV filled with random bf16 (a "fake prefill": block tables and
//    context lengths only); roofline = (weight bytes read + KV bytes read) / copy bandwidth;
//  - host time of a full Forward call (planning, metadata copy, launch) on the same batches;
//  - prefill: one sequence of N tokens, FLOPs = 2 * linear params * N + LM head on the last row +
//    causal attention 4 * layers * heads * head_dim * N^2 / 2, against the measured GEMM peak;
//  - a per-op GPU time breakdown (CUDA events around each op of an un-graphed step) of decode
//    batch 1 and 64 at 1K context and one prefill, to explain a miss;
//  - the skinny GEMM A/B: decode batch 8, 32 and 64 at 1K (those the main run measured) against a
//    second runner with the skinny GEMM off (skinny=off; on, skinny=on, when the main run has it
//    off), and that runner's per-op breakdown at batch 64.
// Prints tables; --json writes every number. Exit status 0, or 1 with a message on error.

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "runtime/base/float16.h"
#include "runtime/base/status.h"
#include "runtime/device/cuda/cuda_status.h"
#include "runtime/model/cuda/cublas_gemm.h"
#include "runtime/model/cuda/cuda_model_runner.h"
#include "runtime/model/cuda/cuda_tuning.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"

namespace tandem {
namespace {

using json = nlohmann::json;

struct Flags {
  std::string model_dir;
  int device = 0;
  std::string json_path;
  int iters = 50;
  std::vector<int> batches = {1, 8, 64, 256};
  std::vector<int> contexts = {1024, 8192};
  std::vector<int> prefill = {512, 2048, 8192};
  std::vector<std::string> skip;  // sections not to run (see --skip)
  std::vector<int> verify_batches = {1, 32};
  std::vector<int> verify_k = {0, 1, 2, 4, 8};  // 0: the plain step, the baseline
  int block_size = 16;                          // KV cache tokens per block
  std::string tuning;                           // the runner's plan (--tuning); "": defaults
};

// Times `fn` (which queues work on `stream`) over iters runs after warmup runs; ms per run.
template <typename Fn>
absl::StatusOr<double> TimeMs(cudaStream_t stream, int warmup, int iters, Fn fn) {
  for (int i = 0; i < warmup; ++i) RETURN_IF_ERROR(fn());
  cudaEvent_t a, b;
  RETURN_IF_CUDA_ERROR(cudaEventCreate(&a), "cudaEventCreate");
  RETURN_IF_CUDA_ERROR(cudaEventCreate(&b), "cudaEventCreate");
  RETURN_IF_CUDA_ERROR(cudaEventRecord(a, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) RETURN_IF_ERROR(fn());
  RETURN_IF_CUDA_ERROR(cudaEventRecord(b, stream), "cudaEventRecord");
  RETURN_IF_CUDA_ERROR(cudaEventSynchronize(b), "timed work");
  float ms = 0;
  RETURN_IF_CUDA_ERROR(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return static_cast<double>(ms) / iters;
}

// Device-to-device copy of 1 GiB: (read + write) bytes per second.
absl::StatusOr<double> CopyBandwidth(cudaStream_t stream) {
  const size_t bytes = size_t{1} << 30;
  void *src = nullptr, *dst = nullptr;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&src, bytes), "cudaMalloc 1 GiB");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&dst, bytes), "cudaMalloc 1 GiB");
  cudaMemsetAsync(src, 1, bytes, stream);
  auto ms = TimeMs(stream, 3, 20, [&]() -> absl::Status {
    RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream),
                         "cudaMemcpyAsync D2D");
    return absl::OkStatus();
  });
  cudaFree(src);
  cudaFree(dst);
  if (!ms.ok()) return ms.status();
  return 2.0 * bytes / (*ms * 1e-3);
}

// cuBLASLt bf16 GEMM 8192^3: FLOP/s.
absl::StatusOr<double> GemmPeak(const GemmTuning& tuning, cudaStream_t stream) {
  const int n = 8192;
  const size_t bytes = size_t{n} * n * 2;
  void *a = nullptr, *b = nullptr, *c = nullptr, *ws = nullptr;
  const size_t ws_bytes = size_t{32} << 20;
  RETURN_IF_CUDA_ERROR(cudaMalloc(&a, bytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&b, bytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&c, bytes), "cudaMalloc");
  RETURN_IF_CUDA_ERROR(cudaMalloc(&ws, ws_bytes), "cudaMalloc");
  // Small values (bf16 0x3c00 = 0.0078) keep the GEMM away from inf without a random fill.
  std::vector<uint16_t> row(n, 0x3c00);
  for (int r = 0; r < n; ++r) {
    cudaMemcpyAsync(static_cast<char*>(a) + static_cast<size_t>(r) * n * 2, row.data(), n * 2,
                    cudaMemcpyHostToDevice, stream);
  }
  cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, stream);
  absl::StatusOr<double> result = absl::InternalError("not run");
  {
    auto gemm = cuda_runner::CublasLtGemm::Create(ws, ws_bytes, tuning);
    if (!gemm.ok()) {
      result = gemm.status();
    } else {
      auto ms = TimeMs(stream, 5, 20, [&]() {
        return (*gemm)->Linear(a, b, nullptr, n, n, n, c, cuda_runner::GemmOut::kBf16, stream);
      });
      if (ms.ok()) {
        result = 2.0 * n * n * static_cast<double>(n) / (*ms * 1e-3);
      } else {
        result = ms.status();
      }
    }
  }
  for (void* p : {a, b, c, ws}) cudaFree(p);
  return result;
}

std::string FormatBytes(double b) {
  return b >= 1e9 ? absl::StrFormat("%.1f GB", b / 1e9) : absl::StrFormat("%.1f MB", b / 1e6);
}

int Run(const Flags& flags) {
  auto fail = [](const absl::Status& s) {
    std::cerr << "engine_bench: " << s << "\n";
    return 1;
  };
  auto run = [&](const std::string& section) {
    return std::find(flags.skip.begin(), flags.skip.end(), section) == flags.skip.end();
  };
  if (cudaSetDevice(flags.device) != cudaSuccess) {
    return fail(absl::UnavailableError(absl::StrCat("no CUDA device ", flags.device)));
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, flags.device);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  json out;
  out["gpu"] = prop.name;
  out["sm_count"] = prop.multiProcessorCount;
  std::printf("GPU %d: %s, %d SMs, %.1f GiB\n", flags.device, prop.name, prop.multiProcessorCount,
              prop.totalGlobalMem / 1073741824.0);
  // The plan this run was started with, so every table says which code paths produced it.
  absl::StatusOr<CudaTuning> tuning = ParseCudaTuning(flags.tuning);
  if (!tuning.ok()) return fail(tuning.status());
  const std::string tuning_spec = FormatCudaTuning(*tuning);
  out["tuning"] = tuning_spec;
  std::printf("tuning: %s\n", tuning_spec.empty() ? "defaults" : tuning_spec.c_str());

  // 1. Ceilings.
  auto bw = CopyBandwidth(stream);
  if (!bw.ok()) return fail(bw.status());
  auto peak = GemmPeak(tuning->gemm, stream);
  if (!peak.ok()) return fail(peak.status());
  std::printf("device copy bandwidth (D2D 1 GiB, read+write): %.2f TB/s\n", *bw / 1e12);
  std::printf("cuBLASLt bf16 GEMM 8192^3 (f32 accumulate):    %.1f TFLOP/s\n", *peak / 1e12);
  out["copy_bandwidth_bytes_per_s"] = *bw;
  out["gemm_peak_flops"] = *peak;

  // 2. Model.
  auto config_or = LoadModelConfig(flags.model_dir);
  if (!config_or.ok()) return fail(config_or.status());
  const ModelConfig c = *config_or;
  auto store = TensorStore::Open(flags.model_dir);
  if (!store.ok()) return fail(store.status());
  const int bs = flags.block_size;
  const size_t kv_per_token = size_t{2} * c.num_layers * c.num_kv_heads * c.head_dim * 2;
  const size_t kv_per_block = kv_per_token * bs;
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  size_t weight_estimate = 0;
  for (const std::string& name : (*store)->Names()) {
    auto v = (*store)->Get(name);
    if (v.ok()) weight_estimate += static_cast<size_t>(v->numel()) * 2;
  }
  const size_t margin = size_t{6} << 30;  // workspaces of an 8K-token prefill, logits, cuBLASLt
  const size_t kv_budget =
      free_bytes > weight_estimate + margin ? free_bytes - weight_estimate - margin : 0;
  auto blocks_for = [&](int batch, int ctx) {
    return static_cast<int64_t>(batch) * ((ctx + bs - 1) / bs);
  };
  int64_t need_blocks = 0;
  for (int n : flags.prefill) need_blocks = std::max(need_blocks, blocks_for(1, n));
  for (int b : flags.batches) {
    for (int ctx : flags.contexts) {
      if (static_cast<size_t>(blocks_for(b, ctx)) * kv_per_block <= kv_budget) {
        need_blocks = std::max(need_blocks, blocks_for(b, ctx));
      }
    }
  }
  if (need_blocks == 0 || static_cast<size_t>(need_blocks) * kv_per_block > kv_budget) {
    return fail(absl::ResourceExhaustedError(
        absl::StrCat("not enough GPU memory for the KV cache: ", free_bytes, " free, ",
                     weight_estimate, " of weights")));
  }
  CudaRunnerOptions ro;
  ro.device_ordinal = flags.device;
  ro.block_size = bs;
  ro.num_blocks = static_cast<int>(need_blocks);
  ro.max_batch_tokens = 8192;
  ro.cuda_graphs = true;
  ro.progress = true;
  ro.tuning = *tuning;
  const auto load_start = std::chrono::steady_clock::now();
  auto runner_or = CreateCudaModelRunner(c, **store, ro);
  if (!runner_or.ok()) return fail(runner_or.status());
  std::unique_ptr<CudaModelRunner> runner = std::move(*runner_or);
  const double load_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count();
  store->reset();
  const KvCacheLayout kv = runner->kv_layout();
  std::printf(
      "model %s: %d layers, hidden %d, %d heads / %d KV heads, vocab %d; weights %s "
      "loaded in %.1f s; KV cache %d blocks of %d tokens (%s)\n",
      flags.model_dir.c_str(), c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads,
      c.vocab_size, FormatBytes(runner->weight_bytes()).c_str(), load_s, kv.num_blocks, bs,
      FormatBytes(kv.bytes).c_str());
  out["model"] = flags.model_dir;
  out["weight_bytes"] = runner->weight_bytes();
  out["load_seconds"] = load_s;
  out["kv_blocks"] = kv.num_blocks;
  out["kv_block_size"] = bs;

  // Fake prefill: random bf16 in the whole KV cache (64 MiB pattern tiled on the device).
  auto fill_kv = [](const KvCacheLayout& layout) {
    const size_t pattern = std::min<size_t>(layout.bytes, size_t{64} << 20);
    std::vector<uint16_t> host(pattern / 2);
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (auto& h : host) h = FloatToBf16(dist(rng));
    char* base = static_cast<char*>(layout.base);
    cudaMemcpy(base, host.data(), pattern, cudaMemcpyHostToDevice);
    for (size_t at = pattern; at < layout.bytes; at += pattern) {
      cudaMemcpy(base + at, base, std::min(pattern, layout.bytes - at), cudaMemcpyDeviceToDevice);
    }
    cudaDeviceSynchronize();
  };
  fill_kv(kv);

  // Linear weights read by a decode step: everything but the embedding table (only B rows of it
  // are read) unless the table doubles as the LM head.
  const double embed_bytes = 2.0 * c.vocab_size * c.hidden_size;
  const double weight_read = runner->weight_bytes() - (c.tie_word_embeddings ? 0 : embed_bytes);
  const double q = c.num_heads * c.head_dim, kvw = c.num_kv_heads * c.head_dim;
  const double layer_params =
      c.hidden_size * (q + 2 * kvw) + q * c.hidden_size + 3.0 * c.hidden_size * c.intermediate_size;

  std::vector<std::vector<int32_t>> tables;
  std::vector<std::vector<int32_t>> tokens;
  auto make_batch = [&](int batch, int ctx, int new_tokens) {
    ForwardBatch fb;
    tables.assign(batch, {});
    tokens.assign(batch, std::vector<int32_t>(new_tokens, 0));
    const int nb = (ctx + bs - 1) / bs;
    for (int i = 0; i < batch; ++i) {
      for (int t = 0; t < new_tokens; ++t) tokens[i][t] = (i * 7919 + t * 104729) % c.vocab_size;
      tables[i].resize(nb);
      for (int j = 0; j < nb; ++j) tables[i][j] = i * nb + j;
      SequenceChunk ch;
      ch.tokens = tokens[i];
      ch.start_pos = ctx - new_tokens;
      ch.block_table = tables[i];
      fb.chunks.push_back(ch);
    }
    return fb;
  };

  // 3. Decode.
  std::printf(
      "\ndecode (CUDA graph replay, %d steps; roofline = (weights %s + KV read) / %.2f "
      "TB/s)\n",
      flags.iters, FormatBytes(weight_read).c_str(), *bw / 1e12);
  std::printf("%6s %7s %10s %12s %12s %9s %10s %12s\n", "batch", "context", "ms/step", "tokens/s",
              "roofline ms", "%roof", "host us", "Forward ms");
  json decode = json::array();
  for (int ctx : flags.contexts) {
    for (int b : flags.batches) {
      json row = {{"batch", b}, {"context", ctx}};
      if (blocks_for(b, ctx) > kv.num_blocks) {
        std::printf("%6d %7d  skipped: KV of %s does not fit\n", b, ctx,
                    FormatBytes(static_cast<double>(blocks_for(b, ctx)) * kv_per_block).c_str());
        row["skipped"] = "KV does not fit";
        decode.push_back(row);
        continue;
      }
      ForwardBatch fb = make_batch(b, ctx, 1);
      auto ms = runner->TimeDeviceStep(fb, 5, flags.iters);
      if (!ms.ok()) return fail(ms.status());
      // Host side of full Forward calls (graph replay + logits to the host).
      double host_us = 0, forward_ms = 0;
      ForwardOutput fo;
      const int calls = 10;
      for (int i = 0; i < calls; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status s = runner->Forward(fb, &fo);
        if (!s.ok()) return fail(s);
        forward_ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        host_us += runner->last_step_stats().host_us;
      }
      host_us /= calls;
      forward_ms /= calls;
      const double kv_read = static_cast<double>(b) * ctx * kv_per_token;
      const double roof_ms = (weight_read + kv_read) / *bw * 1e3;
      std::printf("%6d %7d %10.3f %12.0f %12.3f %8.1f%% %10.1f %12.3f\n", b, ctx, *ms,
                  b / (*ms * 1e-3), roof_ms, 100.0 * roof_ms / *ms, host_us, forward_ms);
      row.update({{"ms_per_step", *ms},
                  {"tokens_per_s", b / (*ms * 1e-3)},
                  {"weight_bytes_read", weight_read},
                  {"kv_bytes_read", kv_read},
                  {"roofline_ms", roof_ms},
                  {"pct_of_roofline", 100.0 * roof_ms / *ms},
                  {"host_us_per_step", host_us},
                  {"forward_call_ms", forward_ms},
                  {"graph_bucket", runner->last_step_stats().graph_bucket}});
      decode.push_back(row);
    }
  }
  out["decode"] = decode;

  // 3b. One decode step at batch 64 returning logits [64, vocab] to the host vs sampling on the
  // GPU (SequenceChunk::sample: only 64 tokens and logprobs come back).
  if (const int ctx = flags.contexts.front();
      run("sampling") && blocks_for(64, ctx) <= kv.num_blocks) {
    ForwardBatch fb = make_batch(64, ctx, 1);
    std::vector<SampleRequest> requests(64);
    for (int i = 0; i < 64; ++i) {
      requests[i].seed = 1000 + i;
      requests[i].temperature = 0.8f;
      requests[i].top_p = i % 2 == 0 ? 0.9f : 1.0f;
      requests[i].top_k = i % 3 == 0 ? 50 : 0;
    }
    auto forward_ms = [&](bool sample) -> absl::StatusOr<std::pair<double, double>> {
      for (int i = 0; i < 64; ++i) fb.chunks[i].sample = sample ? &requests[i] : nullptr;
      ASSIGN_OR_RETURN(double gpu_ms, runner->TimeDeviceStep(fb, 5, flags.iters));
      ForwardOutput fo;
      double ms = 0;
      const int calls = 20;
      for (int i = 0; i < calls; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        RETURN_IF_ERROR(runner->Forward(fb, &fo));
        ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
      }
      return std::make_pair(gpu_ms, ms / calls);
    };
    auto copy = forward_ms(false);
    if (!copy.ok()) return fail(copy.status());
    auto sampled = forward_ms(true);
    if (!sampled.ok()) return fail(sampled.status());
    std::printf(
        "\ndecode batch 64, context %d: logits to host %.3f ms/Forward (GPU step %.3f ms); "
        "sampled on the GPU %.3f ms/Forward (GPU step + sampling %.3f ms)\n",
        ctx, copy->second, copy->first, sampled->second, sampled->first);
    out["device_sampling_b64"] = {{"context", ctx},
                                  {"logits_forward_ms", copy->second},
                                  {"logits_gpu_ms", copy->first},
                                  {"sampled_forward_ms", sampled->second},
                                  {"sampled_gpu_ms", sampled->first}};
  }

  // 3c. Speculative verification: each sequence's last token and k drafts scored in one step
  // (k + 1 logits rows, each sampled greedily on the GPU, as the engine asks for plain requests),
  // against the plain step (k = 0). A step of batch * (k + 1) <= 256 rows replays a graph.
  if (const int ctx = flags.contexts.front(); run("verify")) {
    std::printf(
        "\nverification at context %d (GPU step by CUDA events; Forward: the engine's call, "
        "sampled on the GPU)\n%6s %3s %6s %8s %10s %12s %9s   speedup bound at acceptance "
        "0.5 / 0.7 / 0.9\n",
        ctx, "batch", "k", "rows", "graphed", "GPU ms", "Forward ms", "x plain");
    json verify = json::array();
    for (int b : flags.verify_batches) {
      if (blocks_for(b, ctx) > kv.num_blocks) continue;
      double plain_ms = 0;
      for (int k : flags.verify_k) {
        ForwardBatch fb = make_batch(b, ctx, k + 1);
        std::vector<SampleRequest> requests(static_cast<size_t>(b) * (k + 1));
        for (SampleRequest& r : requests) r.greedy = 1;
        for (int i = 0; i < b; ++i) {
          fb.chunks[i].num_logits = k + 1;
          fb.chunks[i].sample = &requests[static_cast<size_t>(i) * (k + 1)];
        }
        auto gpu_ms = runner->TimeDeviceStep(fb, 5, flags.iters);
        if (!gpu_ms.ok()) return fail(gpu_ms.status());
        ForwardOutput fo;
        double forward_ms = 0;
        const int calls = 20;
        for (int i = 0; i < calls; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          if (absl::Status st = runner->Forward(fb, &fo); !st.ok()) return fail(st);
          forward_ms +=
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count();
        }
        forward_ms /= calls;
        const bool graphed = runner->last_step_stats().graph_bucket > 0;
        if (k == 0) plain_ms = forward_ms;
        // Tokens per verification at acceptance a: 1 + a + ... + a^k; speedup bound: that over
        // the step's cost in plain steps.
        json bound = json::array();
        std::string bounds;
        for (double a : {0.5, 0.7, 0.9}) {
          const double tokens = (1 - std::pow(a, k + 1)) / (1 - a);
          const double x = plain_ms > 0 ? tokens * plain_ms / forward_ms : 0;
          bound.push_back(x);
          absl::StrAppend(&bounds, absl::StrFormat(" %5.2f", x));
        }
        std::printf("%6d %3d %6d %8s %10.3f %12.3f %9.2f  %s\n", b, k, b * (k + 1),
                    graphed ? "yes" : "no", *gpu_ms, forward_ms,
                    plain_ms > 0 ? forward_ms / plain_ms : 0.0, bounds.c_str());
        verify.push_back({{"batch", b},
                          {"k", k},
                          {"context", ctx},
                          {"graphed", graphed},
                          {"gpu_ms", *gpu_ms},
                          {"forward_ms", forward_ms},
                          {"speedup_bound_at_0.5_0.7_0.9", bound}});
      }
    }
    out["verify"] = verify;
  }

  // 4. Prefill.
  std::printf("\nprefill (one sequence, eager; ceiling = FLOPs / %.1f TFLOP/s)\n", *peak / 1e12);
  std::printf("%7s %10s %12s %10s %10s %8s\n", "tokens", "ms", "tokens/s", "TFLOP", "TFLOP/s",
              "%peak");
  json prefill = json::array();
  for (int n : run("prefill") ? flags.prefill : std::vector<int>{}) {
    ForwardBatch fb = make_batch(1, n, n);
    auto ms = runner->TimeDeviceStep(fb, 2, 5);
    if (!ms.ok()) return fail(ms.status());
    const double flops = 2.0 * layer_params * c.num_layers * n +
                         2.0 * c.vocab_size * c.hidden_size +
                         4.0 * c.num_layers * c.num_heads * c.head_dim * double(n) * n / 2;
    const double achieved = flops / (*ms * 1e-3);
    std::printf("%7d %10.2f %12.0f %10.2f %10.1f %7.1f%%\n", n, *ms, n / (*ms * 1e-3), flops / 1e12,
                achieved / 1e12, 100.0 * achieved / *peak);
    prefill.push_back({{"tokens", n},
                       {"ms", *ms},
                       {"tokens_per_s", n / (*ms * 1e-3)},
                       {"flops", flops},
                       {"flops_per_s", achieved},
                       {"pct_of_gemm_peak", 100.0 * achieved / *peak}});
  }
  out["prefill"] = prefill;

  // 5. Per-op breakdowns.
  auto breakdown = [&](CudaModelRunner& r, const std::string& title,
                       ForwardBatch fb) -> absl::StatusOr<json> {
    ASSIGN_OR_RETURN(std::vector<OpTiming> ops, r.ProfileStep(fb));
    double total = 0;
    for (const OpTiming& op : ops) total += op.ms;
    std::printf("\nper-op GPU time, %s (un-graphed, events after each op): %.3f ms\n",
                title.c_str(), total);
    std::printf("%-18s %6s %10s %7s\n", "op", "calls", "ms", "%");
    json j = json::array();
    for (const OpTiming& op : ops) {
      std::printf("%-18s %6d %10.3f %6.1f%%\n", op.name.c_str(), op.calls, op.ms,
                  100.0 * op.ms / std::max(total, 1e-9));
      j.push_back({{"op", op.name}, {"calls", op.calls}, {"ms", op.ms}});
    }
    return json{{"step", title}, {"total_ms", total}, {"ops", j}};
  };
  json profiles = json::array();
  const int pctx = 1024;
  for (const int pb : run("profile") ? std::vector<int>{1, 64} : std::vector<int>{}) {
    if (blocks_for(pb, pctx) > kv.num_blocks) continue;
    auto d = breakdown(*runner, absl::StrCat("decode batch ", pb, " context ", pctx),
                       make_batch(pb, pctx, 1));
    if (!d.ok()) return fail(d.status());
    profiles.push_back(*d);
  }
  if (run("profile")) {
    const int pn = std::min(2048, flags.prefill.empty() ? 2048 : flags.prefill.back());
    auto p = breakdown(*runner, absl::StrCat("prefill ", pn, " tokens"), make_batch(1, pn, pn));
    if (!p.ok()) return fail(p.status());
    profiles.push_back(*p);
  }
  out["profiles"] = profiles;

  // 6. Skinny GEMM A/B: decode batch 8, 32 and 64 at 1K context (graph replay) on a runner
  // created with the skinny GEMM off (skinny=off: cuBLASLt for every multi-row projection)
  // against the main run (whose numbers are the decode table's; by default it takes the skinny
  // GEMM for 2-32 rows on Hopper), or on (skinny=on) when the main run has it off; and that
  // runner's per-op breakdown at batch 64, so the projections can be compared op by op with
  // section 5. The main runner is released first.
  if (run("skinny-ab")) {
    runner.reset();
    CudaTuning other_tuning = *tuning;
    other_tuning.gemm.skinny = tuning->gemm.skinny == GemmTuning::Skinny::kOff
                                   ? GemmTuning::Skinny::kOn
                                   : GemmTuning::Skinny::kOff;
    const std::string other_spec = FormatCudaTuning(other_tuning);
    const int ab_ctx = 1024;
    const std::vector<int> ab_batches = {8, 32, 64};
    auto store3 = TensorStore::Open(flags.model_dir);
    if (!store3.ok()) return fail(store3.status());
    ro.num_blocks = static_cast<int>(blocks_for(ab_batches.back(), ab_ctx));
    ro.progress = false;
    ro.tuning = other_tuning;
    auto runner3 = CreateCudaModelRunner(c, **store3, ro);
    if (!runner3.ok()) return fail(runner3.status());
    store3->reset();
    fill_kv((*runner3)->kv_layout());
    std::printf(
        "\nskinny GEMM A/B, decode context %d (CUDA graph replay, %d steps): main run (%s) vs "
        "%s\n",
        ab_ctx, flags.iters, tuning_spec.empty() ? "defaults" : tuning_spec.c_str(),
        other_spec.c_str());
    std::printf("%6s %12s %12s %9s %12s\n", "batch", "main ms", "other ms", "speedup",
                "main %roof");
    json ab = json::array();
    for (const int b : ab_batches) {
      double main_ms = NAN;
      for (const json& row : decode) {
        if (row["batch"] == b && row["context"] == ab_ctx && row.contains("ms_per_step")) {
          main_ms = row["ms_per_step"].get<double>();
        }
      }
      if (std::isnan(main_ms)) continue;  // the main run did not measure this batch
      auto other = (*runner3)->TimeDeviceStep(make_batch(b, ab_ctx, 1), 5, flags.iters);
      if (!other.ok()) return fail(other.status());
      const double roof_ms =
          (weight_read + static_cast<double>(b) * ab_ctx * kv_per_token) / *bw * 1e3;
      std::printf("%6d %12.3f %12.3f %8.2fx %11.1f%%\n", b, main_ms, *other, *other / main_ms,
                  100.0 * roof_ms / main_ms);
      ab.push_back({{"batch", b},
                    {"context", ab_ctx},
                    {"main_ms", main_ms},
                    {"other_ms", *other},
                    {"other_tuning", other_spec},
                    {"roofline_ms", roof_ms}});
    }
    out["skinny_ab"] = ab;
    auto prof =
        breakdown(**runner3, absl::StrCat("decode batch 64 context ", ab_ctx, ", ", other_spec),
                  make_batch(64, ab_ctx, 1));
    if (!prof.ok()) return fail(prof.status());
    out["skinny_ab_profile"] = *prof;
  }

  if (!flags.json_path.empty()) {
    std::ofstream f(flags.json_path);
    f << out.dump(2) << "\n";
    if (!f) return fail(absl::InternalError("cannot write " + flags.json_path));
    std::printf("\nwrote %s\n", flags.json_path.c_str());
  }
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  tandem::Flags flags;
  CLI::App app{"Tandem CUDA engine benchmark: decode and prefill beside measured ceilings"};
  app.add_option("--model", flags.model_dir, "Hugging Face model directory")->required();
  app.add_option("--device", flags.device, "CUDA device ordinal (default 0)");
  app.add_option("--json", flags.json_path, "write every number to this JSON file");
  app.add_option("--iters", flags.iters, "timed decode steps per point (default 50)")
      ->check(CLI::PositiveNumber);
  app.add_option("--batches", flags.batches, "decode batch sizes")->delimiter(',');
  app.add_option("--contexts", flags.contexts, "decode context lengths")->delimiter(',');
  app.add_option("--prefill", flags.prefill, "prefill token counts")->delimiter(',');
  app.add_option("--block-size", flags.block_size, "KV cache tokens per block (default 16)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--verify-batches", flags.verify_batches,
                 "batch sizes of the verification section (default 1,32)")
      ->delimiter(',');
  app.add_option("--verify-k", flags.verify_k,
                 "draft counts of the verification section, 0 first (default 0,1,2,4,8)")
      ->delimiter(',');
  app.add_option("--skip", flags.skip,
                 "sections not to run: sampling, verify, prefill, profile, skinny-ab")
      ->delimiter(',')
      ->check(CLI::IsMember({"sampling", "verify", "prefill", "profile", "skinny-ab"}));
  app.add_option("--tuning", flags.tuning,
                 "the runner's kernel plan, key=value[,key=value...] (docs/tuning.md; default: "
                 "the measured choices)")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const absl::StatusOr<tandem::CudaTuning> t = tandem::ParseCudaTuning(value);
            return t.ok() ? std::string() : std::string(t.status().message());
          },
          "SPEC"));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  return tandem::Run(flags);
}
