#include "runtime/model/cuda/cuda_tuning.h"

#include <functional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
// Their row bounds only (constants of plain headers: nothing to link).
#include "runtime/kernels/cuda/cluster_gemm.h"
#include "runtime/kernels/cuda/skinny_gemm.h"

namespace tandem {
namespace {

using cuda::DecodeAttentionTuning;
using EvictFirst = cuda::DecodeAttentionTuning::EvictFirst;
using Skinny = GemmTuning::Skinny;

// The most candidates autotune.candidates may ask cuBLASLt's heuristic for.
constexpr int kAutotuneMaxCandidates = 128;

bool ParseInt(absl::string_view v, int* out) { return absl::SimpleAtoi(v, out); }

// One key of the spec: what it takes (for messages and --help), how a value sets it, whether the
// field is in range, and how the field prints.
struct Key {
  const char* name;
  const char* takes;
  std::function<bool(absl::string_view, CudaTuning&)> parse;  // false: malformed
  std::function<bool(const CudaTuning&)> valid;
  std::function<std::string(const CudaTuning&)> format;
};

// An integer field; `field` maps a CudaTuning (const or not) to it.
template <typename Field>
Key Int(const char* name, const char* takes, Field field, bool (*in_range)(int)) {
  return Key{name, takes,
             [field](absl::string_view v, CudaTuning& t) { return ParseInt(v, &field(t)); },
             [field, in_range](const CudaTuning& t) { return in_range(field(t)); },
             [field](const CudaTuning& t) { return absl::StrCat(field(t)); }};
}

// A bool field spelled 0 or 1.
template <typename Field>
Key Bool01(const char* name, Field field) {
  return Key{name, "0 or 1 (default 0)",
             [field](absl::string_view v, CudaTuning& t) {
               if (v != "0" && v != "1") return false;
               field(t) = v == "1";
               return true;
             },
             [](const CudaTuning&) { return true; },
             [field](const CudaTuning& t) { return std::string(field(t) ? "1" : "0"); }};
}

// The shortest "%.Ng" that reads back as the same double.
std::string FormatDouble(double v) {
  std::string s;
  for (int digits = 6; digits <= 17; ++digits) {
    s = absl::StrFormat("%.*g", digits, v);
    double back = 0;
    if (absl::SimpleAtod(s, &back) && back == v) break;
  }
  return s;
}

bool InRange(int v, int lo, int hi) { return v >= lo && v <= hi; }
bool SkinnyRows(int v) { return v == 0 || InRange(v, 2, cuda::kSkinnyGemmMaxRows); }

const std::vector<Key>& Keys() {
  static const std::vector<Key>* keys = new std::vector<Key>{
      Int(
          "decode.split_target", "an integer in [32, 65536] (default 2048)",
          [](auto& t) -> auto& { return t.decode.split_target; },
          [](int v) {
            return InRange(v, cuda::kDecodeSplitTargetMin, cuda::kDecodeSplitTargetMax);
          }),
      Int(
          "decode.min_split_tokens", "a multiple of 64 in [64, 4096] (default 256)",
          [](auto& t) -> auto& { return t.decode.min_split_tokens; },
          [](int v) {
            return InRange(v, cuda::kDecodeSplitTokensStep, cuda::kDecodeSplitTokensMax) &&
                   v % cuda::kDecodeSplitTokensStep == 0;
          }),
      Int(
          "decode.chain", "an integer in [0, 4] (default 4; 0 or 1: no chaining)",
          [](auto& t) -> auto& { return t.decode.max_chain; },
          [](int v) { return InRange(v, 0, cuda::kDecodeChainMax); }),
      Key{"decode.evict_first", "auto, on or off (default auto)",
          [](absl::string_view v, CudaTuning& t) {
            if (v == "auto") {
              t.decode.evict_first = EvictFirst::kAuto;
            } else if (v == "on") {
              t.decode.evict_first = EvictFirst::kAlways;
            } else if (v == "off") {
              t.decode.evict_first = EvictFirst::kNever;
            } else {
              return false;
            }
            return true;
          },
          [](const CudaTuning&) { return true; },
          [](const CudaTuning& t) -> std::string {
            switch (t.decode.evict_first) {
              case EvictFirst::kAuto:
                return "auto";
              case EvictFirst::kAlways:
                return "on";
              case EvictFirst::kNever:
                return "off";
            }
            return "auto";
          }},
      Key{"skinny", "auto, off or on (default auto)",
          [](absl::string_view v, CudaTuning& t) {
            if (v == "auto") {
              t.gemm.skinny = Skinny::kAuto;
            } else if (v == "off") {
              t.gemm.skinny = Skinny::kOff;
            } else if (v == "on") {
              t.gemm.skinny = Skinny::kOn;
            } else {
              return false;
            }
            return true;
          },
          [](const CudaTuning&) { return true; },
          [](const CudaTuning& t) -> std::string {
            switch (t.gemm.skinny) {
              case Skinny::kAuto:
                return "auto";
              case Skinny::kOff:
                return "off";
              case Skinny::kOn:
                return "on";
            }
            return "auto";
          }},
      Int(
          "skinny.max_rows", "0 or an integer in [2, 64] (default 0: 32, or 64 with skinny=on)",
          [](auto& t) -> auto& { return t.gemm.skinny_max_rows; }, SkinnyRows),
      Int(
          "skinny.qkv_max_rows", "0 or an integer in [2, 64] (default 0: skinny.max_rows)",
          [](auto& t) -> auto& { return t.gemm.skinny_qkv_max_rows; }, SkinnyRows),
      Int(
          "skinny.gated_max_rows", "0 or an integer in [2, 64] (default 0: skinny.max_rows)",
          [](auto& t) -> auto& { return t.gemm.skinny_gated_max_rows; }, SkinnyRows),
      Int(
          "skinny.ctas_per_sm", "an integer in [1, 16] (default 2)",
          [](auto& t) -> auto& { return t.gemm.skinny_ctas_per_sm; },
          [](int v) { return InRange(v, 1, 16); }),
      Key{"cluster", "on or off (default on; the kernel runs on compute capability 9.0 only)",
          [](absl::string_view v, CudaTuning& t) {
            if (v != "on" && v != "off") return false;
            t.gemm.cluster = v == "on";
            return true;
          },
          [](const CudaTuning&) { return true; },
          [](const CudaTuning& t) { return std::string(t.gemm.cluster ? "on" : "off"); }},
      Key{"cluster.rows", "MIN-MAX within 1-64 (default 33-64)",
          [](absl::string_view v, CudaTuning& t) {
            const std::vector<absl::string_view> parts = absl::StrSplit(v, '-');
            return parts.size() == 2 && ParseInt(parts[0], &t.gemm.cluster_min_rows) &&
                   ParseInt(parts[1], &t.gemm.cluster_max_rows);
          },
          [](const CudaTuning& t) {
            return t.gemm.cluster_min_rows >= 1 &&
                   t.gemm.cluster_max_rows >= t.gemm.cluster_min_rows &&
                   t.gemm.cluster_max_rows <= cuda::kClusterGemmMaxRows;
          },
          [](const CudaTuning& t) {
            return absl::StrCat(t.gemm.cluster_min_rows, "-", t.gemm.cluster_max_rows);
          }},
      Key{"cluster.shapes", "NxK[:NxK...], positive n and k (default empty: every shape)",
          [](absl::string_view v, CudaTuning& t) {
            t.gemm.cluster_shapes.clear();
            for (absl::string_view item : absl::StrSplit(v, ':')) {
              const std::vector<absl::string_view> nk = absl::StrSplit(item, 'x');
              int n = 0, k = 0;
              if (nk.size() != 2 || !ParseInt(nk[0], &n) || !ParseInt(nk[1], &k)) return false;
              t.gemm.cluster_shapes.emplace_back(n, k);
            }
            return true;
          },
          [](const CudaTuning& t) {
            for (const auto& [n, k] : t.gemm.cluster_shapes) {
              if (n <= 0 || k <= 0) return false;
            }
            return true;
          },
          [](const CudaTuning& t) {
            return absl::StrJoin(t.gemm.cluster_shapes, ":", [](std::string* out, const auto& s) {
              absl::StrAppend(out, s.first, "x", s.second);
            });
          }},
      Key{"cluster.min_fill", "a number in [0, 1] (default 0.9)",
          [](absl::string_view v, CudaTuning& t) {
            return absl::SimpleAtod(v, &t.gemm.cluster_min_fill);
          },
          [](const CudaTuning& t) {
            return t.gemm.cluster_min_fill >= 0 && t.gemm.cluster_min_fill <= 1;
          },
          [](const CudaTuning& t) { return FormatDouble(t.gemm.cluster_min_fill); }},
      Int(
          "cluster.max_tile", "64, 128, 192 or 256 (default 64)",
          [](auto& t) -> auto& { return t.gemm.cluster_max_tile; },
          [](int v) { return InRange(v, 64, 256) && v % 64 == 0; }),
      Int(
          "cluster.stages", "0 (as many as fit, the default) or an integer in [2, 16]",
          [](auto& t) -> auto& { return t.gemm.cluster_stages; },
          [](int v) { return v == 0 || InRange(v, 2, 16); }),
      Int(
          "autotune.candidates", "an integer in [1, 128] (default 8)",
          [](auto& t) -> auto& { return t.gemm.autotune_candidates; },
          [](int v) { return InRange(v, 1, kAutotuneMaxCandidates); }),
      Bool01(
          "autotune.splitk", [](auto& t) -> auto& { return t.gemm.autotune_splitk; }),
      Bool01(
          "autotune.log", [](auto& t) -> auto& { return t.gemm.autotune_log; }),
  };
  return *keys;
}

const Key* FindKey(absl::string_view name) {
  for (const Key& k : Keys()) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

absl::Status BadValue(const Key& key, absl::string_view value) {
  return absl::InvalidArgumentError(
      absl::StrCat("CUDA tuning key ", key.name, " takes ", key.takes, ", got \"", value, "\""));
}

}  // namespace

std::string CudaTuningKeys() {
  std::string out;
  for (const Key& k : Keys()) absl::StrAppend(&out, k.name, ": ", k.takes, "\n");
  return out;
}

absl::StatusOr<CudaTuning> ParseCudaTuning(std::string_view spec) {
  CudaTuning t;
  const absl::string_view text(spec.data(), spec.size());
  if (text.empty()) return t;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CUDA tuning item \"", item, "\" is not key=value; the keys are:\n", CudaTuningKeys()));
    }
    const absl::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    const Key* key = FindKey(name);
    if (key == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown CUDA tuning key \"", name,
                                                     "\"; the keys are:\n", CudaTuningKeys()));
    }
    if (!key->parse(value, t) || !key->valid(t)) return BadValue(*key, value);
  }
  return t;
}

absl::Status ValidateCudaTuning(const CudaTuning& tuning) {
  for (const Key& k : Keys()) {
    if (!k.valid(tuning)) return BadValue(k, k.format(tuning));
  }
  return absl::OkStatus();
}

std::string FormatCudaTuning(const CudaTuning& tuning) {
  const CudaTuning defaults;
  std::vector<std::string> items;
  for (const Key& k : Keys()) {
    const std::string value = k.format(tuning);
    if (value != k.format(defaults)) items.push_back(absl::StrCat(k.name, "=", value));
  }
  return absl::StrJoin(items, ",");
}

}  // namespace tandem
