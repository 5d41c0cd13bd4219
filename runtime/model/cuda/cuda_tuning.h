#pragma once
// The CUDA engine's plan: the tuning parameters of its kernels and of its GEMM routing, chosen
// once when the runner is created (CudaRunnerOptions::tuning) and passed down by argument (the
// decode attention launches, CublasLtGemm::Create). Nothing is read from the environment. Every
// field changes speed only: results stay within float32 summation order of the defaults, which
// are the measured choices (docs/tuning.md has each key, its default and effect; bench/RESULTS.md
// the numbers).
//
// Plain data and host code, no CUDA types: built in every configuration, so command lines take
// `--cuda-tuning SPEC` (and validate it at startup) in builds without CUDA too.
// Thread-safety: values; the functions are pure.

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/kernels/cuda/decode_attention_tuning.h"

namespace tandem {

// Which decode-sized GEMMs take which kernel (runtime/model/cuda/cublas_gemm.h). Row bounds count
// activation rows (the decode batch); single-row calls always take the GEMV.
struct GemmTuning {
  // The skinny tensor-core GEMM (runtime/kernels/cuda/skinny_gemm.h): kAuto takes it for 2-32 rows
  // on compute capability 9.0 only (its wgmma kernel), kOn for 2-64 rows on every GPU (elsewhere
  // its mma.sync kernel), kOff never.
  enum class Skinny { kAuto, kOff, kOn };
  Skinny skinny = Skinny::kAuto;
  // Row bounds in [2, 64]; 0: the mode's default (32 for kAuto, 64 for kOn). The QKV projection
  // with RoPE fused and the gate/up projection with SiLU fused have their own (0: skinny_max_rows).
  int skinny_max_rows = 0;
  int skinny_qkv_max_rows = 0;
  int skinny_gated_max_rows = 0;
  int skinny_ctas_per_sm = 2;  // [1, 16]: the CTAs per SM its split-K plan aims at
  // The cluster GEMM (runtime/kernels/cuda/cluster_gemm.h; it runs on compute capability 9.0
  // only): calls of cluster_min_rows..cluster_max_rows rows (within 1-64) whose (n, k) has a plan
  // that keeps at least cluster_min_fill of the SMs busy with tiles of at most cluster_max_tile
  // weight rows (64, 128, 192 or 256); cluster_shapes, when not empty, lists the only (n, k) it
  // takes. cluster_stages: its pipeline depth, 0 for as many as fit or 2-16.
  bool cluster = true;
  int cluster_min_rows = 33;
  int cluster_max_rows = 64;
  std::vector<std::pair<int, int>> cluster_shapes;
  double cluster_min_fill = 0.9;
  int cluster_max_tile = 64;
  int cluster_stages = 0;
  // cuBLASLt autotuning: the heuristic's candidates timed per shape ([1, 128]), split-K variants
  // of them timed too, each tuned shape's choice logged.
  int autotune_candidates = 8;
  bool autotune_splitk = false;
  bool autotune_log = false;

  bool operator==(const GemmTuning&) const = default;
};

struct CudaTuning {
  cuda::DecodeAttentionTuning decode;
  GemmTuning gemm;

  bool operator==(const CudaTuning&) const = default;
};

// The keys ParseCudaTuning takes, with what each takes, one per line (for --help and errors).
std::string CudaTuningKeys();

// Parses "key=value[,key=value...]" over the defaults (an empty spec gives the defaults; a key
// given twice keeps the last value). Keys: decode.split_target, decode.min_split_tokens,
// decode.chain, decode.evict_first=auto|on|off, skinny=auto|off|on, skinny.max_rows,
// skinny.qkv_max_rows, skinny.gated_max_rows, skinny.ctas_per_sm, cluster=on|off,
// cluster.rows=MIN-MAX, cluster.shapes=NxK[:NxK...], cluster.min_fill, cluster.max_tile,
// cluster.stages, autotune.candidates, autotune.splitk=0|1, autotune.log=0|1.
// InvalidArgument naming the key and what it takes for an unknown key, a malformed item or a
// value out of range.
absl::StatusOr<CudaTuning> ParseCudaTuning(std::string_view spec);

// OK when every field is in its range; otherwise InvalidArgument naming the field by its key.
// ParseCudaTuning's results always pass; the runner checks tuning filled in code with it.
absl::Status ValidateCudaTuning(const CudaTuning& tuning);

// The spec of the fields that differ from the defaults, in key order ("" for the defaults):
// ParseCudaTuning(FormatCudaTuning(t)) == t for every valid t.
std::string FormatCudaTuning(const CudaTuning& tuning);

}  // namespace tandem
