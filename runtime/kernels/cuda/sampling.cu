// GPU sampling (contract: sampling_kernels.h). One CTA of 1024 threads per row; everything the
// row needs stays in shared memory and probabilities are recomputed from the logits on each pass
// (a double exp per element is cheaper than a 1 MB scratch row per pass).
//
// Per sampled row, mirroring FilteredProbs/Sample in runtime/sampling/sampler.cc:
//   1. max logit and argmax (greedy rows stop here, after the raw log-sum for the logprob);
//   2. S1 = sum exp(x / T - max / T) (the CPU's divisor), and the raw log-sum;
//   3. p_i = exp(x_i / T - max / T) / S1 exactly as the CPU writes it; min_p keeps p >= min_p / S1.
//      The rank order is (p descending, id ascending); 64-bit p bit patterns sort like p.
//   4. top_k: a radix select on the p bits (8 bits per pass, counts per bin) finds the k-th kept
//      token; top_p: when the top_k set has at most kCap tokens it is gathered into shared memory,
//      bitonic-sorted in rank order and walked by one thread exactly as the CPU does; otherwise a
//      radix select with per-bin mass finds the crossing token.
//   5. the kept set: at most kCap tokens are sorted by id and normalized and walked by one thread
//      left to right (the CPU's arithmetic); larger sets use a tree-summed normalizer and a
//      block-wide prefix scan in id order.
// Radix passes skip elements whose logit lies outside the logit range of the chosen bin (p is
// monotone in the logit), so only the first passes pay for exp on the whole row.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/sampling_kernels.h"

namespace tandem::cuda::internal {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCap = kSamplingExactCandidates;
constexpr int kBins = 256;
constexpr int kDigitBits = 8;
constexpr int kScanItems = 4;  // contiguous tokens per thread in the id-order scan
constexpr int kNoId = 0x7fffffff;

__device__ __forceinline__ uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Bit-identical to tandem::UniformFromSeed.
__device__ __forceinline__ double UniformFromSeed(uint64_t seed, uint64_t step) {
  const uint64_t bits = SplitMix64(SplitMix64(seed) ^ SplitMix64(step + 0x632be59bd9b4e019ULL));
  return __dmul_rn(static_cast<double>(bits >> 11), 1.0 / 9007199254740992.0);
}

// Float bits mapped so that unsigned order is float order.
__device__ __forceinline__ uint32_t OrderKey(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ uint64_t ProbKey(double p) {
  return static_cast<uint64_t>(__double_as_longlong(p));
}

__device__ __forceinline__ double KeyProb(uint64_t k) {
  return __longlong_as_double(static_cast<long long>(k));
}

// The row's filtered distribution before top_k/top_p; identical in every thread.
struct Dist {
  const float* row;
  int vocab;
  double temperature;
  double max_scaled;  // max_i double(x_i) / T
  double sum;         // S1
  double min_p_threshold;

  // The CPU's probs[i] after the division by S1 (before min_p).
  __device__ __forceinline__ double Prob(float x) const {
    return exp(__dsub_rn(__ddiv_rn(static_cast<double>(x), temperature), max_scaled)) / sum;
  }
  // Nonzero after min_p: the CPU zeroes p < min_p * max_p (and exp may underflow to 0).
  __device__ __forceinline__ bool Eligible(double p) const {
    return p > 0.0 && !(p < min_p_threshold);
  }
};

// A prefix of the rank order among eligible tokens: token i (key k) belongs iff
// k > key || (k == key && i <= id). Every member has OrderKey(logit) >= xlo.
struct Cut {
  uint64_t key;
  int id;
  uint32_t xlo;
};

__device__ __forceinline__ bool InCut(uint64_t k, int i, const Cut& c) {
  return k > c.key || (k == c.key && i <= c.id);
}

struct Shared {
  uint64_t keys[kCap];
  int ids[kCap];
  unsigned bin_count[kBins];
  double bin_mass[kBins];
  unsigned bin_xmin[kBins];
  unsigned bin_xmax[kBins];
  double warp_d[kWarps];
  long long warp_ll[kWarps];
  float warp_f[kWarps];
  int warp_i[kWarps];
  int count;
  int found;
  // Broadcasts from thread 0.
  uint64_t b_prefix;
  uint32_t b_lo, b_hi;
  int b_done;
  long long b_ties_needed;
  double b_value;
  int b_int;
};

__device__ __forceinline__ double WarpSum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ long long WarpSumLL(long long v) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Deterministic block sums: a fixed shuffle tree per warp, then warp 0 over the warp totals.
__device__ double BlockSum(double v, Shared& sh) {
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp_d[warp] = v;
  __syncthreads();
  if (warp == 0) {
    double t = WarpSum(sh.warp_d[lane]);
    if (lane == 0) sh.b_value = t;
  }
  __syncthreads();
  const double out = sh.b_value;
  __syncthreads();
  return out;
}

__device__ long long BlockSumLL(long long v, Shared& sh) {
  v = WarpSumLL(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp_ll[warp] = v;
  __syncthreads();
  if (warp == 0) {
    long long t = WarpSumLL(sh.warp_ll[lane]);
    if (lane == 0) sh.warp_ll[0] = t;
  }
  __syncthreads();
  const long long out = sh.warp_ll[0];
  __syncthreads();
  return out;
}

__device__ int BlockMinInt(int v, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o /= 2) v = min(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) sh.warp_i[warp] = v;
  __syncthreads();
  if (warp == 0) {
    int t = sh.warp_i[lane];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) t = min(t, __shfl_xor_sync(0xffffffffu, t, o));
    if (lane == 0) sh.b_int = t;
  }
  __syncthreads();
  const int out = sh.b_int;
  __syncthreads();
  return out;
}

// Max logit and its lowest index.
__device__ void ArgMax(const float* row, int vocab, Shared& sh, float* max_out, int* arg_out) {
  float best = -INFINITY;
  int best_i = kNoId;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = row[i];
    if (x > best || (x == best && i < best_i)) {
      best = x;
      best_i = i;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o /= 2) {
    const float v = __shfl_xor_sync(0xffffffffu, best, o);
    const int j = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (v > best || (v == best && j < best_i)) {
      best = v;
      best_i = j;
    }
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    sh.warp_f[warp] = best;
    sh.warp_i[warp] = best_i;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float b = sh.warp_f[0];
    int bi = sh.warp_i[0];
    for (int w = 1; w < kWarps; ++w) {
      if (sh.warp_f[w] > b || (sh.warp_f[w] == b && sh.warp_i[w] < bi)) {
        b = sh.warp_f[w];
        bi = sh.warp_i[w];
      }
    }
    sh.b_value = b;
    sh.b_int = bi;
  }
  __syncthreads();
  *max_out = static_cast<float>(sh.b_value);
  *arg_out = sh.b_int;
  __syncthreads();
}

// Member test of `c` for token i with logit x; sets *p when it is a member.
__device__ __forceinline__ bool Member(const Dist& d, const Cut& c, float x, int i, double* p) {
  if (OrderKey(x) < c.xlo) return false;
  *p = d.Prob(x);
  return d.Eligible(*p) && InCut(ProbKey(*p), i, c);
}

// Number of members of `c` and their tree-summed mass.
__device__ void CountMass(const Dist& d, const Cut& c, Shared& sh, long long* count, double* mass) {
  long long n = 0;
  double m = 0.0;
  for (int i = threadIdx.x; i < d.vocab; i += kThreads) {
    double p;
    if (Member(d, c, d.row[i], i, &p)) {
      ++n;
      m += p;
    }
  }
  *count = BlockSumLL(n, sh);
  *mass = BlockSum(m, sh);
}

// Id of the t-th (1-based) member of `c` with key `key` in id order, via a block-wide scan.
__device__ int NthTie(const Dist& d, const Cut& c, uint64_t key, uint32_t lo, uint32_t hi,
                      long long t, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) sh.found = kNoId;
  long long before = 0;
  for (int base = 0; base < d.vocab; base += kThreads) {
    const int i = base + threadIdx.x;
    bool flag = false;
    if (i < d.vocab) {
      const float x = d.row[i];
      const uint32_t xk = OrderKey(x);
      if (xk >= lo && xk <= hi) {
        const double p = d.Prob(x);
        flag = d.Eligible(p) && ProbKey(p) == key && InCut(key, i, c);
      }
    }
    const unsigned ballot = __ballot_sync(0xffffffffu, flag);
    if (lane == 0) sh.warp_i[warp] = __popc(ballot);
    __syncthreads();
    long long rank = before + __popc(ballot & ((1u << lane) - 1u));
    long long total = 0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) rank += sh.warp_i[w];
      total += sh.warp_i[w];
    }
    if (flag && rank == t - 1) sh.found = i;
    before += total;
    __syncthreads();
    if (before >= t) break;
  }
  __syncthreads();
  return sh.found;
}

// The prefix of `u` (rank order) that ends at the first member where the running count reaches
// count_target or the running mass reaches mass_target (when use_mass); `u` when neither is
// reached. Bin masses are tree sums; within the final key the tied tokens are added one at a time
// in id order, as the CPU walk does.
__device__ Cut Select(const Dist& d, const Cut& u, long long count_target, bool use_mass,
                      double mass_target, Shared& sh) {
  uint64_t prefix = 0;
  uint32_t lo = u.xlo, hi = 0xffffffffu;
  long long count_above = 0;
  double mass_above = 0.0;
  for (int shift = 64 - kDigitBits; shift >= 0; shift -= kDigitBits) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.bin_count[b] = 0;
      sh.bin_mass[b] = 0.0;
      sh.bin_xmin[b] = 0xffffffffu;
      sh.bin_xmax[b] = 0;
    }
    __syncthreads();
    // Runs of equal bins are accumulated in registers: early passes put most tokens in one bin.
    int run_bin = -1;
    unsigned run_count = 0;
    double run_mass = 0.0;
    uint32_t run_min = 0xffffffffu, run_max = 0;
    auto flush = [&]() {
      if (run_bin < 0) return;
      atomicAdd(&sh.bin_count[run_bin], run_count);
      if (use_mass) atomicAdd(&sh.bin_mass[run_bin], run_mass);
      atomicMin(&sh.bin_xmin[run_bin], run_min);
      atomicMax(&sh.bin_xmax[run_bin], run_max);
    };
    for (int i = threadIdx.x; i < d.vocab; i += kThreads) {
      const float x = d.row[i];
      const uint32_t xk = OrderKey(x);
      if (xk < lo || xk > hi) continue;
      const double p = d.Prob(x);
      if (!d.Eligible(p)) continue;
      const uint64_t k = ProbKey(p);
      if (!InCut(k, i, u)) continue;
      if (shift + kDigitBits < 64 && (k >> (shift + kDigitBits)) != prefix) continue;
      const int b = static_cast<int>((k >> shift) & (kBins - 1));
      if (b != run_bin) {
        flush();
        run_bin = b;
        run_count = 0;
        run_mass = 0.0;
        run_min = 0xffffffffu;
        run_max = 0;
      }
      ++run_count;
      run_mass += p;
      run_min = min(run_min, xk);
      run_max = max(run_max, xk);
    }
    flush();
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      for (int b = kBins - 1; b >= 0; --b) {
        const unsigned n = sh.bin_count[b];
        if (n == 0) continue;
        if (count_above + n >= count_target ||
            (use_mass && mass_above + sh.bin_mass[b] >= mass_target)) {
          chosen = b;
          break;
        }
        count_above += n;
        mass_above += sh.bin_mass[b];
      }
      sh.b_done = chosen < 0;
      if (chosen >= 0) {
        sh.b_prefix = (prefix << kDigitBits) | static_cast<uint64_t>(chosen);
        sh.b_lo = sh.bin_xmin[chosen];
        sh.b_hi = sh.bin_xmax[chosen];
        if (shift == 0) {
          // Every token in this bin has the same key: add them one at a time in id order.
          const long long ties = sh.bin_count[chosen];
          long long need = count_target - count_above;
          if (need > ties) need = ties;
          if (use_mass) {
            const double p = KeyProb(sh.b_prefix);
            double m = mass_above;
            for (long long j = 1; j <= need; ++j) {
              m += p;
              if (m >= mass_target) {
                need = j;
                break;
              }
            }
          }
          sh.b_ties_needed = need;
        }
      }
    }
    __syncthreads();
    if (sh.b_done) return u;
    prefix = sh.b_prefix;
    lo = sh.b_lo;
    hi = sh.b_hi;
    __syncthreads();
  }
  const long long need = sh.b_ties_needed;
  __syncthreads();
  const int id = NthTie(d, u, prefix, lo, hi, need, sh);
  return Cut{prefix, id, lo};
}

// Rank order: key descending, then id ascending; the padding (key 0, id kNoId) sorts last.
__device__ __forceinline__ bool RankBefore(uint64_t ka, int ia, uint64_t kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// Sorts sh.keys/ids[0, n) (n <= kCap) in rank order (by_id false) or by id; pads to a power of
// two with (0, kNoId).
__device__ void BitonicSort(int n, bool by_id, Shared& sh) {
  int size = 1;
  while (size < n) size *= 2;
  for (int j = n + threadIdx.x; j < size; j += kThreads) {
    sh.keys[j] = 0;
    sh.ids[j] = kNoId;
  }
  __syncthreads();
  for (int len = 2; len <= size; len *= 2) {
    for (int stride = len / 2; stride > 0; stride /= 2) {
      for (int t = threadIdx.x; t < size / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const bool up = (i & len) == 0;
        const bool j_first = by_id ? sh.ids[j] < sh.ids[i]
                                   : RankBefore(sh.keys[j], sh.ids[j], sh.keys[i], sh.ids[i]);
        const bool i_first = by_id ? sh.ids[i] < sh.ids[j]
                                   : RankBefore(sh.keys[i], sh.ids[i], sh.keys[j], sh.ids[j]);
        if (up ? j_first : i_first) {
          const uint64_t k = sh.keys[i];
          sh.keys[i] = sh.keys[j];
          sh.keys[j] = k;
          const int id = sh.ids[i];
          sh.ids[i] = sh.ids[j];
          sh.ids[j] = id;
        }
      }
      __syncthreads();
    }
  }
}

// Copies the members of `c` (at most kCap of them) into sh.keys/ids; returns their number.
__device__ int Gather(const Dist& d, const Cut& c, Shared& sh) {
  if (threadIdx.x == 0) sh.count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < d.vocab; i += kThreads) {
    double p;
    if (Member(d, c, d.row[i], i, &p)) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < kCap) {
        sh.keys[slot] = ProbKey(p);
        sh.ids[slot] = i;
      }
    }
  }
  __syncthreads();
  const int n = min(sh.count, kCap);
  __syncthreads();
  return n;
}

// The CPU's final steps over a kept set sorted by id in sh.keys/ids[0, n): normalize by the
// left-to-right sum and walk the CDF left to right. Thread 0 only.
__device__ int WalkSorted(int n, double u, const Shared& sh) {
  double sum = 0.0;
  for (int j = 0; j < n; ++j) sum += KeyProb(sh.keys[j]);
  double cum = 0.0;
  for (int j = 0; j < n; ++j) {
    cum += KeyProb(sh.keys[j]) / sum;
    if (u < cum) return sh.ids[j];
  }
  return sh.ids[n - 1];
}

// The CDF walk in id order over a large kept set `c` with normalizer `sum`: each thread owns
// kScanItems consecutive tokens of a chunk; an exclusive block scan gives each its starting sum.
__device__ int WalkLarge(const Dist& d, const Cut& c, double sum, double u, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  double base = 0.0;
  int last = -1;
  constexpr int kChunk = kThreads * kScanItems;
  for (int start = 0; start < d.vocab; start += kChunk) {
    double q[kScanItems];
    double local = 0.0;
    const int first_id = start + threadIdx.x * kScanItems;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      q[j] = 0.0;
      const int i = first_id + j;
      double p;
      if (i < d.vocab && Member(d, c, d.row[i], i, &p)) {
        q[j] = p / sum;
        local += q[j];
        last = i;
      }
    }
    // Exclusive scan of `local` over the block.
    double incl = local;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const double v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) sh.warp_d[warp] = incl;
    __syncthreads();
    double warp_before = 0.0, chunk_total = 0.0;
    for (int w = 0; w < kWarps; ++w) {
      if (w < warp) warp_before += sh.warp_d[w];
      chunk_total += sh.warp_d[w];
    }
    double cum = base + warp_before + (incl - local);
    int hit = kNoId;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      if (q[j] > 0.0 && hit == kNoId) {
        cum += q[j];
        if (u < cum) hit = first_id + j;
      }
    }
    __syncthreads();
    hit = BlockMinInt(hit, sh);
    if (hit != kNoId) return hit;
    base += chunk_total;
  }
  // u beyond the rounded total: the last kept token, as the CPU's fallback.
  last = -BlockMinInt(-last, sh);
  return last;
}

__global__ void __launch_bounds__(kThreads, 1)
    SamplingKernel(const float* __restrict__ logits, const SamplingRow* __restrict__ params,
                   int vocab, int32_t* __restrict__ tokens, float* __restrict__ logprobs) {
  __shared__ Shared sh;
  const int r = blockIdx.x;
  const float* row = logits + static_cast<size_t>(r) * vocab;
  const SamplingRow prm = params[r];

  float xmax;
  int argmax;
  ArgMax(row, vocab, sh, &xmax, &argmax);
  const bool greedy = prm.greedy != 0 || !(prm.temperature > 0.0f);
  const double temperature = static_cast<double>(prm.temperature);
  const double max_scaled = greedy ? 0.0 : __ddiv_rn(static_cast<double>(xmax), temperature);

  // Raw log-sum (logprob) and S1 in one pass.
  double raw = 0.0, scaled = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float x = row[i];
    const double e_raw = exp(__dsub_rn(static_cast<double>(x), static_cast<double>(xmax)));
    raw += e_raw;
    if (!greedy) {
      scaled += prm.temperature == 1.0f
                    ? e_raw
                    : exp(__dsub_rn(__ddiv_rn(static_cast<double>(x), temperature), max_scaled));
    }
  }
  const double raw_sum = BlockSum(raw, sh);
  const double log_sum = log(raw_sum) + static_cast<double>(xmax);

  int token = argmax;
  if (!greedy) {
    const double s1 = BlockSum(scaled, sh);
    Dist d{row, vocab, temperature, max_scaled, s1, 0.0};
    if (prm.min_p > 0.0f) d.min_p_threshold = static_cast<double>(prm.min_p) * (1.0 / s1);
    const double u = UniformFromSeed(prm.seed, prm.step);
    const Cut all{0, kNoId, 0};
    const bool top_k_on = prm.top_k > 0 && prm.top_k < vocab;
    Cut kept = all;
    bool kept_in_smem = false;  // kept set sorted by id in sh.keys/ids[0, kept_n)
    int kept_n = 0;
    if (top_k_on || prm.top_p < 1.0f) {
      const Cut order = top_k_on ? Select(d, all, prm.top_k, false, 0.0, sh) : all;
      long long order_n;
      double order_mass;
      CountMass(d, order, sh, &order_n, &order_mass);
      if (order_n <= kCap) {
        const int n = Gather(d, order, sh);
        BitonicSort(n, /*by_id=*/false, sh);
        if (threadIdx.x == 0) {
          double total = 0.0;
          for (int j = 0; j < n; ++j) total += KeyProb(sh.keys[j]);
          double kept_mass = 0.0;
          int keep = 0;
          for (int j = 0; j < n; ++j) {
            keep = j + 1;
            kept_mass += KeyProb(sh.keys[j]);
            if (kept_mass >= static_cast<double>(prm.top_p) * total) break;
          }
          sh.b_int = keep;
        }
        __syncthreads();
        kept_n = sh.b_int;
        __syncthreads();
        BitonicSort(kept_n, /*by_id=*/true, sh);
        kept_in_smem = true;
      } else {
        kept = Select(d, order, order_n, true, static_cast<double>(prm.top_p) * order_mass, sh);
      }
    }
    if (kept_in_smem) {
      if (threadIdx.x == 0) sh.b_int = WalkSorted(kept_n, u, sh);
      __syncthreads();
      token = sh.b_int;
    } else {
      long long n;
      double mass;
      CountMass(d, kept, sh, &n, &mass);
      if (n <= kCap) {
        const int m = Gather(d, kept, sh);
        BitonicSort(m, /*by_id=*/true, sh);
        if (threadIdx.x == 0) sh.b_int = WalkSorted(m, u, sh);
        __syncthreads();
        token = sh.b_int;
      } else {
        token = WalkLarge(d, kept, mass, u, sh);
      }
    }
  }
  if (threadIdx.x == 0) {
    tokens[r] = token;
    logprobs[r] = static_cast<float>(static_cast<double>(row[token]) - log_sum);
  }
}

}  // namespace

cudaError_t LaunchSamplingRaw(const SamplingArgs& a, cudaStream_t stream) {
  SamplingKernel<<<a.rows, kThreads, 0, stream>>>(a.logits, a.params, a.vocab, a.tokens,
                                                  a.logprobs);
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal
