// GPU sampling (contract: sampling_kernels.h). One CTA of 1024 threads per row; everything the
// row needs stays in shared memory and weights are recomputed from the logits on each pass.
//
// Per sampled row, mirroring FilteredWeights/Sample in runtime/sampling/sampler.cc with the shared
// integer arithmetic of runtime/sampling/sampling_math.h:
//   1. max logit and argmax (greedy rows stop here, after the raw log-sum for the logprob);
//   2. q_i = TokenWeight(x_i) in [0, 2^40]; min_p keeps q >= MinPWeight(min_p). The rank order is
//      (q descending, id ascending).
//   3. top_k: a radix select on q (8 bits per pass, counts per bin) finds the k-th kept token;
//      top_p: when the top_k set has at most kCap tokens it is gathered into shared memory,
//      bitonic-sorted in rank order and walked by one thread; otherwise a radix select with
//      per-bin integer mass finds the crossing token.
//   4. the draw: floor(u * total) against inclusive prefix sums in id order, by one thread over a
//      sorted kept set of at most kCap tokens, or by a block-wide scan otherwise.
// All sums are of integers, so the order of summation does not matter and every path equals the
// CPU's left-to-right walk. Radix passes skip elements whose logit lies outside the logit range of
// the chosen bin (they cannot have the bin's prefix), so only the first passes pay for exp on the
// whole row.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "runtime/kernels/cuda/sampling_kernels.h"
#include "runtime/sampling/sampling_math.h"

namespace tandem::cuda::internal {
namespace {

namespace sm = ::tandem::sampling_math;

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kCap = kSamplingExactCandidates;
constexpr int kBins = 256;
constexpr int kDigitBits = 8;
constexpr int kScanItems = 4;  // contiguous tokens per thread in the id-order scan
constexpr int kNoId = 0x7fffffff;

// Float bits mapped so that unsigned order is float order.
__device__ __forceinline__ uint32_t OrderKey(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

// The row's weights before top_k/top_p; identical in every thread.
struct Dist {
  const float* row;
  int vocab;
  double temperature;
  double max_scaled;    // sm::ScaledLogit(max logit, T)
  uint64_t min_weight;  // sm::MinPWeight(min_p), >= 1

  // The CPU's weight of a token with logit x (before min_p).
  __device__ __forceinline__ uint64_t Weight(float x) const {
    return sm::TokenWeight(x, temperature, max_scaled);
  }
  // Kept by min_p (which also drops weight 0).
  __device__ __forceinline__ bool Eligible(uint64_t q) const { return q >= min_weight; }
};

// A prefix of the rank order among eligible tokens: token i (key k) belongs iff
// k > key || (k == key && i <= id). Every member has OrderKey(logit) >= xlo (a bound Select
// collects from the members themselves, so it holds even where the weight, an approximation of
// exp, is not monotone in the logit at the last bit).
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
  unsigned long long bin_mass[kBins];
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
  uint32_t b_cut_xlo;
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

// Member test of `c` for token i with logit x; sets *q when it is a member.
__device__ __forceinline__ bool Member(const Dist& d, const Cut& c, float x, int i, uint64_t* q) {
  if (OrderKey(x) < c.xlo) return false;
  *q = d.Weight(x);
  return d.Eligible(*q) && InCut(*q, i, c);
}

// Number of members of `c` and their total weight.
__device__ void CountMass(const Dist& d, const Cut& c, Shared& sh, long long* count,
                          uint64_t* mass) {
  long long n = 0;
  long long m = 0;  // < 2^59
  for (int i = threadIdx.x; i < d.vocab; i += kThreads) {
    uint64_t q;
    if (Member(d, c, d.row[i], i, &q)) {
      ++n;
      m += static_cast<long long>(q);
    }
  }
  *count = BlockSumLL(n, sh);
  *mass = static_cast<uint64_t>(BlockSumLL(m, sh));
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
        const uint64_t q = d.Weight(x);
        flag = d.Eligible(q) && q == key && InCut(key, i, c);
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
// count_target or the running weight reaches mass_target (when use_mass); `u` when neither is
// reached. Within the final key the tied tokens count one at a time in id order, as the CPU walk
// does.
__device__ Cut Select(const Dist& d, const Cut& u, long long count_target, bool use_mass,
                      uint64_t mass_target, Shared& sh) {
  uint64_t prefix = 0;
  uint32_t lo = u.xlo, hi = 0xffffffffu;
  long long count_above = 0;
  uint64_t mass_above = 0;
  // Thread 0: the min logit key over the tokens ranked above the chosen bins so far, so that the
  // cut's xlo bound holds without assuming that the weight is monotone in the logit.
  uint32_t xlo_above = 0xffffffffu;
  // Weights are at most 2^40, so the digits above bit 47 are always 0.
  for (int shift = 40; shift >= 0; shift -= kDigitBits) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      sh.bin_count[b] = 0;
      sh.bin_mass[b] = 0;
      sh.bin_xmin[b] = 0xffffffffu;
      sh.bin_xmax[b] = 0;
    }
    __syncthreads();
    // Runs of equal bins are accumulated in registers: early passes put most tokens in one bin.
    int run_bin = -1;
    unsigned run_count = 0;
    unsigned long long run_mass = 0;
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
      const uint64_t k = d.Weight(x);
      if (!d.Eligible(k)) continue;
      if (!InCut(k, i, u)) continue;
      if ((k >> (shift + kDigitBits)) != prefix) continue;
      const int b = static_cast<int>((k >> shift) & (kBins - 1));
      if (b != run_bin) {
        flush();
        run_bin = b;
        run_count = 0;
        run_mass = 0;
        run_min = 0xffffffffu;
        run_max = 0;
      }
      ++run_count;
      run_mass += k;
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
        xlo_above = min(xlo_above, sh.bin_xmin[b]);
      }
      sh.b_done = chosen < 0;
      if (chosen >= 0) {
        sh.b_prefix = (prefix << kDigitBits) | static_cast<uint64_t>(chosen);
        sh.b_lo = sh.bin_xmin[chosen];
        sh.b_hi = sh.bin_xmax[chosen];
        if (shift == 0) {
          // Every token in this bin has the same weight q > 0: the walk stops at the first of
          // them (in id order) where the count or the weight reaches its target.
          const long long ties = sh.bin_count[chosen];
          long long need = count_target - count_above;
          if (need > ties) need = ties;
          if (use_mass && mass_target > mass_above) {
            const uint64_t q = sh.b_prefix;
            const uint64_t by_mass = (mass_target - mass_above + q - 1) / q;
            if (by_mass < static_cast<uint64_t>(need)) need = static_cast<long long>(by_mass);
          }
          sh.b_ties_needed = need;
          sh.b_cut_xlo = min(xlo_above, sh.b_lo);
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
  const uint32_t cut_xlo = sh.b_cut_xlo;
  __syncthreads();
  const int id = NthTie(d, u, prefix, lo, hi, need, sh);
  return Cut{prefix, id, cut_xlo};
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
    uint64_t q;
    if (Member(d, c, d.row[i], i, &q)) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < kCap) {
        sh.keys[slot] = q;
        sh.ids[slot] = i;
      }
    }
  }
  __syncthreads();
  const int n = min(sh.count, kCap);
  __syncthreads();
  return n;
}

// The draw over a kept set sorted by id in sh.keys/ids[0, n): the first token whose inclusive
// prefix weight exceeds floor(u * total). Thread 0 only.
__device__ int WalkSorted(int n, uint64_t bits, const Shared& sh) {
  if (n == 0) return kNoId;  // no token has a weight (logits all -inf or NaN)
  uint64_t total = 0;
  for (int j = 0; j < n; ++j) total += sh.keys[j];
  const uint64_t threshold = sm::DrawThreshold(bits, total);
  uint64_t cum = 0;
  for (int j = 0; j < n; ++j) {
    cum += sh.keys[j];
    if (cum > threshold) return sh.ids[j];
  }
  return sh.ids[n - 1];  // unreachable: cum reaches total > threshold
}

// The draw in id order over a large kept set `c` of total weight `total`: each thread owns
// kScanItems consecutive tokens of a chunk; an exclusive block scan gives each its starting sum.
__device__ int WalkLarge(const Dist& d, const Cut& c, uint64_t total, uint64_t bits, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const uint64_t threshold = sm::DrawThreshold(bits, total);
  unsigned long long base = 0;
  constexpr int kChunk = kThreads * kScanItems;
  for (int start = 0; start < d.vocab; start += kChunk) {
    unsigned long long q[kScanItems];
    unsigned long long local = 0;
    const int first_id = start + threadIdx.x * kScanItems;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      q[j] = 0;
      const int i = first_id + j;
      uint64_t w;
      if (i < d.vocab && Member(d, c, d.row[i], i, &w)) {
        q[j] = w;
        local += w;
      }
    }
    // Exclusive scan of `local` over the block.
    unsigned long long incl = local;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    if (lane == 31) sh.warp_ll[warp] = static_cast<long long>(incl);
    __syncthreads();
    unsigned long long warp_before = 0, chunk_total = 0;
    for (int w = 0; w < kWarps; ++w) {
      const unsigned long long t = static_cast<unsigned long long>(sh.warp_ll[w]);
      if (w < warp) warp_before += t;
      chunk_total += t;
    }
    unsigned long long cum = base + warp_before + (incl - local);
    int hit = kNoId;
#pragma unroll
    for (int j = 0; j < kScanItems; ++j) {
      if (q[j] > 0 && hit == kNoId) {
        cum += q[j];
        if (cum > threshold) hit = first_id + j;
      }
    }
    __syncthreads();
    hit = BlockMinInt(hit, sh);
    if (hit != kNoId) return hit;
    base += chunk_total;
  }
  return kNoId;  // unreachable: the prefix sums reach total > threshold
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
  if (argmax >= vocab) argmax = 0;  // every logit NaN
  const bool greedy = prm.greedy != 0 || !(prm.temperature > 0.0f);

  // Raw log-sum for the logprob.
  double raw = 0.0;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    raw += exp(static_cast<double>(row[i]) - static_cast<double>(xmax));
  }
  const double raw_sum = BlockSum(raw, sh);
  const double log_sum = log(raw_sum) + static_cast<double>(xmax);

  int token = argmax;
  if (!greedy) {
    const double temperature = static_cast<double>(prm.temperature);
    const Dist d{row, vocab, temperature, sm::ScaledLogit(xmax, temperature),
                 sm::MinPWeight(prm.min_p)};
    const uint64_t bits = sm::UniformBits(prm.seed, prm.step);
    const Cut all{0, kNoId, 0};
    const bool top_k_on = prm.top_k > 0 && prm.top_k < vocab;
    Cut kept = all;
    bool kept_in_smem = false;  // kept set sorted by id in sh.keys/ids[0, kept_n)
    int kept_n = 0;
    if (top_k_on || prm.top_p < 1.0f) {
      const Cut order = top_k_on ? Select(d, all, prm.top_k, false, 0, sh) : all;
      long long order_n;
      uint64_t order_mass;
      CountMass(d, order, sh, &order_n, &order_mass);
      const uint64_t target = sm::TopPTarget(prm.top_p, order_mass);
      if (order_n <= kCap) {
        const int n = Gather(d, order, sh);
        BitonicSort(n, /*by_id=*/false, sh);
        if (threadIdx.x == 0) {
          uint64_t kept_mass = 0;
          int keep = 0;
          for (int j = 0; j < n; ++j) {
            keep = j + 1;
            kept_mass += sh.keys[j];
            if (kept_mass >= target) break;
          }
          sh.b_int = keep;
        }
        __syncthreads();
        kept_n = sh.b_int;
        __syncthreads();
        BitonicSort(kept_n, /*by_id=*/true, sh);
        kept_in_smem = true;
      } else {
        kept = Select(d, order, order_n, true, target, sh);
      }
    }
    if (kept_in_smem) {
      if (threadIdx.x == 0) sh.b_int = WalkSorted(kept_n, bits, sh);
      __syncthreads();
      token = sh.b_int;
    } else {
      long long n;
      uint64_t mass;
      CountMass(d, kept, sh, &n, &mass);
      if (n <= kCap) {
        const int m = Gather(d, kept, sh);
        BitonicSort(m, /*by_id=*/true, sh);
        if (threadIdx.x == 0) sh.b_int = WalkSorted(m, bits, sh);
        __syncthreads();
        token = sh.b_int;
      } else {
        token = WalkLarge(d, kept, mass, bits, sh);
      }
    }
  }
  // Degenerate rows (no finite logit) fall back to the argmax; the logprob is then NaN or -inf.
  if (token < 0 || token >= vocab) token = argmax;
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
