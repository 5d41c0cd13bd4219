// KV of one prompt from this process (the "prefill worker") into another process's GPU memory
// (the "decode worker", kvtransfer_cuda_ipc_peer) over the cuda_ipc backend, against the ceiling
// measured in the same run: a same-process cudaMemcpyAsync of the same bytes, contiguous.
//
//   kv_ipc_bench --peer PATH [--device 0] [--tokens 4096] [--layers 32] [--kv-heads 8]
//                [--head-dim 128] [--block-size 16] [--iters 20] [--json FILE]
//
// Defaults are one 4,096-token prompt of the Llama-3-8B shape (512 MiB of bf16 KV). Both pools
// hold twice the prompt's blocks. Cases (median of --iters, host wall time from PostWrite to
// Poll = kDone, the scatter kernel's piece upload included):
//   contiguous: the prompt in blocks 0..n-1 on both sides (the planner merges them: one op per
//               layer and K/V);
//   scattered:  random distinct blocks on each side (one op per block, layer and K/V);
//   layer:      one layer's blocks, scattered (the unit of layer-wise streaming).
// After the scattered case the peer hashes its memory and the bench checks it against what the
// ops must have produced (exit status 1 on a mismatch or any failure).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "kvtransfer/cuda_ipc/peer_process.h"
#include "kvtransfer/kv_layout.h"
#include "kvtransfer/transfer_backend.h"

namespace tandem::kvtransfer {
namespace {

struct Flags {
  std::string peer;
  int device = 0;
  int tokens = 4096, layers = 32, kv_heads = 8, head_dim = 128, block_size = 16, iters = 20;
  std::string json;
};

uint64_t Fnv1a(const std::vector<unsigned char>& bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Fail(const std::string& why) {
  std::cerr << "kv_ipc_bench: " << why << "\n";
  return 1;
}

int Run(const Flags& f) {
  KvLayout l;
  l.num_layers = f.layers;
  l.block_size = f.block_size;
  l.num_kv_heads = f.kv_heads;
  l.head_dim = f.head_dim;
  l.elem_bytes = 2;
  const int prompt_blocks = (f.tokens + f.block_size - 1) / f.block_size;
  l.num_blocks = 2 * prompt_blocks;
  l.block_bytes = static_cast<uint64_t>(f.block_size) * f.kv_heads * f.head_dim * 2;
  l.block_stride = l.block_bytes;
  l.kv_stride = l.block_bytes * l.num_blocks;
  l.layer_stride = 2 * l.kv_stride;
  const uint64_t pool_bytes = l.layer_stride * l.num_layers;
  const uint64_t prompt_bytes = 2 * l.block_bytes * prompt_blocks * l.num_layers;

  if (cudaSetDevice(f.device) != cudaSuccess) return Fail("no GPU");
  auto peer = cuda_ipc::PeerProcess::Start(f.peer, pool_bytes, f.device, absl::Seconds(60));
  if (!peer.ok()) return Fail(std::string(peer.status().message()));
  void* src = nullptr;
  void* scratch = nullptr;
  if (cudaMalloc(&src, pool_bytes) != cudaSuccess ||
      cudaMalloc(&scratch, prompt_bytes) != cudaSuccess) {
    return Fail("cudaMalloc failed");
  }
  std::vector<unsigned char> data(pool_bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t r = rng();
    std::memcpy(data.data() + i, &r, 8);
  }
  if (cudaMemcpy(src, data.data(), pool_bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
    return Fail("upload failed");
  }

  // Ceiling: a same-process device copy of the prompt's bytes.
  cudaStream_t stream;
  cudaEvent_t start, stop;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<double> ceiling_ms;
  for (int i = 0; i < f.iters + 2; ++i) {
    cudaEventRecord(start, stream);
    cudaMemcpyAsync(scratch, src, prompt_bytes, cudaMemcpyDeviceToDevice, stream);
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 2) ceiling_ms.push_back(ms);
  }

  BackendOptions options;
  options.agent_name = "kv-ipc-bench";
  options.cuda_device = f.device;
  auto backend = CreateTransferBackend("cuda_ipc", options);
  if (!backend.ok()) return Fail(std::string(backend.status().message()));
  TransferBackend& b = **backend;
  auto region = b.RegisterMemory(src, pool_bytes, MemoryKind::kCuda);
  if (!region.ok()) return Fail(std::string(region.status().message()));
  if (absl::Status s = b.Connect("peer", (*peer)->address()); !s.ok()) {
    return Fail(std::string(s.message()));
  }

  std::vector<int32_t> ordered(prompt_blocks), src_scattered, dst_scattered;
  std::iota(ordered.begin(), ordered.end(), 0);
  std::vector<int32_t> all(l.num_blocks);
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  src_scattered.assign(all.begin(), all.begin() + prompt_blocks);
  std::shuffle(all.begin(), all.end(), rng);
  dst_scattered.assign(all.begin(), all.begin() + prompt_blocks);

  struct Case {
    std::string name;
    std::vector<CopyOp> ops;
    uint64_t bytes = 0;
    double ms = 0;
    double post_ms = 0;  // host time inside PostWrite (planning the pieces, upload, launch)
  };
  std::vector<Case> cases(3);
  cases[0].name = "contiguous";
  cases[1].name = "scattered";
  cases[2].name = "layer";
  auto plan = [&](const std::vector<int32_t>& s, const std::vector<int32_t>& d) {
    return PlanBlockCopies(l, l, s, d, f.tokens, 0);
  };
  auto contiguous = plan(ordered, ordered);
  auto scattered = plan(src_scattered, dst_scattered);
  if (!contiguous.ok() || !scattered.ok()) return Fail("planning failed");
  cases[0].ops = *contiguous;
  cases[1].ops = *scattered;
  for (const CopyOp& op : *scattered) {
    if (op.remote_offset < l.layer_stride) cases[2].ops.push_back(op);  // layer 0 only
  }
  for (Case& c : cases) {
    for (const CopyOp& op : c.ops) c.bytes += op.length;
    // The checked case starts from zeroed memory (the one before wrote other blocks).
    if (c.name == "scattered" && !(*peer)->Command("zero", absl::Seconds(60)).ok()) {
      return Fail("zero failed");
    }
    TransferRequest request{.local_region = region->id,
                            .peer = "peer",
                            .remote_region = (*peer)->region(),
                            .ops = c.ops,
                            .notification = ""};
    std::vector<double> ms, post_ms;
    for (int i = 0; i < f.iters + 2; ++i) {
      const absl::Time t0 = absl::Now();
      auto h = b.PostWrite(request);
      const double post = absl::ToDoubleMilliseconds(absl::Now() - t0);
      if (!h.ok()) return Fail(absl::StrCat(c.name, ": ", h.status().message()));
      while (true) {
        auto state = b.Poll(*h);
        if (!state.ok() || *state == TransferState::kFailed) return Fail(c.name + ": failed");
        if (*state == TransferState::kDone) break;
      }
      const double elapsed = absl::ToDoubleMilliseconds(absl::Now() - t0);
      (void)b.Release(*h);
      if (i >= 2) {
        ms.push_back(elapsed);
        post_ms.push_back(post);
      }
    }
    c.ms = Median(ms);
    c.post_ms = Median(post_ms);
    if (c.name == "scattered") {
      std::vector<unsigned char> expected(pool_bytes, 0);
      for (const CopyOp& op : c.ops) {
        std::memcpy(expected.data() + op.remote_offset, data.data() + op.local_offset, op.length);
      }
      auto hash = (*peer)->Command("hash", absl::Seconds(60));
      const std::string want = absl::StrFormat("hash %016x", Fnv1a(expected));
      if (!hash.ok() || *hash != want) {
        return Fail(absl::StrCat("scattered: the peer's memory is wrong (", hash.ok() ? *hash : "",
                                 " != ", want, ")"));
      }
    }
  }

  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, f.device);
  const double ceiling = Median(ceiling_ms);
  const double ceiling_gbs = prompt_bytes / ceiling / 1e6;
  std::printf("kv_ipc_bench on %s: %d tokens, %d layers, %d KV heads x %d, block %d: %.1f MiB\n",
              prop.name, f.tokens, f.layers, f.kv_heads, f.head_dim, f.block_size,
              prompt_bytes / 1048576.0);
  std::printf("%-28s %8s %10s %10s %10s\n", "case", "ops", "MiB", "ms", "GB/s");
  std::printf("%-28s %8d %10.1f %10.3f %10.1f\n", "ceiling: same-process memcpy", 1,
              prompt_bytes / 1048576.0, ceiling, ceiling_gbs);
  std::string json = absl::StrFormat(
      "{\"gpu\": \"%s\", \"tokens\": %d, \"prompt_bytes\": %d, \"ceiling_ms\": %.4f, "
      "\"ceiling_gbs\": %.1f, \"cases\": [",
      prop.name, f.tokens, prompt_bytes, ceiling, ceiling_gbs);
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    const double gbs = c.bytes / c.ms / 1e6;
    std::printf(
        "%-28s %8zu %10.1f %10.3f %10.1f  (%.0f%% of the ceiling's rate; %.3f ms in "
        "PostWrite)\n",
        ("cuda_ipc " + c.name).c_str(), c.ops.size(), c.bytes / 1048576.0, c.ms, gbs,
        100.0 * gbs / ceiling_gbs, c.post_ms);
    json += absl::StrFormat(
        "%s{\"case\": \"%s\", \"ops\": %d, \"bytes\": %d, \"ms\": %.4f, \"post_ms\": %.4f, "
        "\"gbs\": %.1f}",
        i ? ", " : "", c.name, c.ops.size(), c.bytes, c.ms, c.post_ms, gbs);
  }
  json += "]}\n";
  if (!f.json.empty()) std::ofstream(f.json) << json;
  return 0;
}

}  // namespace
}  // namespace tandem::kvtransfer

int main(int argc, char** argv) {
  tandem::kvtransfer::Flags f;
  CLI::App app{"cuda_ipc KV transfer between two processes on one GPU"};
  app.add_option("--peer", f.peer, "kvtransfer_cuda_ipc_peer binary")->required();
  app.add_option("--device", f.device, "GPU");
  app.add_option("--tokens", f.tokens, "prompt tokens")->check(CLI::PositiveNumber);
  app.add_option("--layers", f.layers, "layers")->check(CLI::PositiveNumber);
  app.add_option("--kv-heads", f.kv_heads, "KV heads")->check(CLI::PositiveNumber);
  app.add_option("--head-dim", f.head_dim, "head dimension")->check(CLI::PositiveNumber);
  app.add_option("--block-size", f.block_size, "tokens per block")->check(CLI::PositiveNumber);
  app.add_option("--iters", f.iters, "timed iterations")->check(CLI::PositiveNumber);
  app.add_option("--json", f.json, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  return tandem::kvtransfer::Run(f);
}
