// GPU sampling (contract: sampling_kernels.h). One CTA of 1024 threads per row; everything the
// row needs stays in shared memory and weights are recomputed from the logits where needed.
//
// Per sampled row, mirroring FilteredWeights/Sample in runtime/sampling/sampler.cc with the shared
// integer arithmetic of runtime/sampling/sampling_math.h:
//   1. max logit and argmax (greedy rows stop here, after the raw log-sum for the logprob);
//   2. one pass over the row: the raw log-sum (same per-thread order as ever, so the same double),
//      and, where the row needs them, q_i = TokenWeight(x_i) in [0, 2^40] with min_p (q >=
//      MinPWeight(min_p)) for the count and total weight of the eligible tokens, per-tile totals
//      (tiles of 1024 ids) for the draw, and per-thread counts of the tokens by distance below
//      the max logit (levels of half an octave of (max - x) / T) for the candidate set of step 4.
//      The rank order is (q descending, id ascending).
//   3. rows without top_k / top_p draw at once: warp 0 finds the tile where the prefix weight
//      passes floor(u * total) and one block scan over that tile finds the token.
//   4. rows with top_k / top_p first try the candidate set C: the tokens of the deepest level
//      that holds at most kCap tokens (the logits nearest the max), with their weights, in shared
//      memory. Every other token has a logit <= x_out, the largest logit outside C, and so a
//      weight <= TokenWeight(x_out) + 1 (the portable exp is within 0.0001 of exp * 2^40, so q is
//      monotone in x up to 1; the bound adds 2). When the k-th token of C (top_k), or the token
//      where the top_p walk over C stops (top_p alone, against the total of step 2), weighs more
//      than that bound, every token ranked above it is in C and C decides the row exactly as the
//      whole vocabulary would: C is bitonic-sorted in rank order and walked with a block scan,
//      the kept prefix sorted by id and scanned for the draw. Otherwise (mass spread over more
//      than kCap tokens, or many exact ties) the row takes the general path:
//   5. top_k: a radix select on the weight (8-bit digits of a log-scale key, counts per bin) finds
//      the k-th kept token; top_p: when the top_k set has at most kCap tokens it is gathered and
//      walked as in 4, otherwise a radix select with per-bin integer mass finds the crossing
//      token; the draw: a sorted walk for at most kCap kept tokens, else the tile walk of 3.
// All sums are of integers, so the order of summation does not matter and every path equals the
// CPU's left-to-right walk. Radix passes skip elements whose logit lies outside the logit range of
// the chosen bin (they cannot have the bin's prefix), so only their first pass pays for exp on the
// whole row. Rows that step 4 decides compute exp * 2^40 only for C (top_k) or once per token
// (top_p alone); only the general path walks the row more than once with it.

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
constexpr int kNoId = 0x7fffffff;
static_assert(kCap == 2 * kThreads);  // the block walks give each thread two candidates
// Tiles of kThreads consecutive ids: iteration j of a strided loop covers tile j.
constexpr int kMaxTiles = kSamplingMaxVocab / kThreads;
static_assert(kMaxTiles * kThreads == kSamplingMaxVocab && kMaxTiles % 32 == 0);
// Levels of v = (max - x) / (30 T) by its exponent and first mantissa bit: level 15 is
// [0.75, 1), 14 is [0.5, 0.75), 13 is [0.375, 0.5), ..., 0 is v < 1.5 * 2^-8.
constexpr int kLevels = 16;
constexpr int kLevelBase = 2 * (127 - 8);  // (float bits >> 22) of 2^-8
static_assert(kWarps == 2 * kLevels);
// LogKey(q) has 46 bits; Select takes five 8-bit digits from bit 38 down, then the last 6 bits.
constexpr int kKeyPasses = 6;

// Float bits mapped so that unsigned order is float order.
__device__ __forceinline__ uint32_t OrderKey(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) != 0 ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ float KeyToFloat(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) != 0 ? (k & 0x7fffffffu) : ~k);
}

// An order-preserving bijection of weights q in [1, 2^40] onto 46-bit keys: the exponent of q
// (6 bits) above the 40 bits that follow its leading one. Radix digits of this key split the
// weights by ratio, not by absolute value, so one pass isolates a quarter octave.
__device__ __forceinline__ uint64_t LogKey(uint64_t q) {
  const int e = 63 - __clzll(static_cast<long long>(q));
  constexpr uint64_t kMask = sm::kWeightOne - 1;
  return (static_cast<uint64_t>(e) << sm::kWeightBits) | ((q << (sm::kWeightBits - e)) & kMask);
}

__device__ __forceinline__ uint64_t FromLogKey(uint64_t k) {
  const int e = static_cast<int>(k >> sm::kWeightBits);
  return ((k & (sm::kWeightOne - 1)) | sm::kWeightOne) >> (sm::kWeightBits - e);
}

// The level of a logit x (0 nearest the max; kLevels or more: not counted, NaN included) for
// scale = 1 / (30 T) in float. Any deterministic function would do (it only picks the candidate
// set; the bound of step 4 is taken from the tokens left out); this one is monotone.
__device__ __forceinline__ int Level(float x, float xmax, float scale) {
  const float v = __fmul_rn(__fsub_rn(xmax, x), scale);
  if (!(v < 1.0f)) return kLevels;
  return max(static_cast<int>(__float_as_uint(v) >> 22) - kLevelBase, 0);
}

// Sum over the warp of weights q <= 2^40 (in 20-bit halves, each sum below 2^25).
__device__ __forceinline__ uint64_t WarpSumWeight(uint64_t q) {
  const unsigned lo = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(q & 0xfffffu));
  const unsigned hi = __reduce_add_sync(0xffffffffu, static_cast<unsigned>(q >> 20));
  return (static_cast<uint64_t>(hi) << 20) + lo;
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

struct Candidates {
  uint64_t keys[kCap];
  int ids[kCap];
};

struct Shared {
  union {
    Candidates cand;
    uint16_t level_count[kLevels][kThreads];  // the row pass only: [level][thread]
  };
  unsigned long long tile_mass[kMaxTiles];
  unsigned level_half[kWarps];
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
  unsigned out_key;
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
  // Digits of LogKey(q): five of 8 bits from bit 38 down, then the last 6 bits.
  for (int pass = 0; pass < kKeyPasses; ++pass) {
    const int shift = pass + 1 < kKeyPasses ? 38 - kDigitBits * pass : 0;
    const int width = pass + 1 < kKeyPasses ? kDigitBits : 6;
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
      const uint64_t q = d.Weight(x);
      if (!d.Eligible(q)) continue;
      if (!InCut(q, i, u)) continue;
      const uint64_t k = LogKey(q);
      if ((k >> (shift + width)) != prefix) continue;
      const int b = static_cast<int>((k >> shift) & ((1u << width) - 1));
      if (b != run_bin) {
        flush();
        run_bin = b;
        run_count = 0;
        run_mass = 0;
        run_min = 0xffffffffu;
        run_max = 0;
      }
      ++run_count;
      run_mass += q;
      run_min = min(run_min, xk);
      run_max = max(run_max, xk);
    }
    flush();
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      for (int b = (1 << width) - 1; b >= 0; --b) {
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
        sh.b_prefix = (prefix << width) | static_cast<uint64_t>(chosen);
        sh.b_lo = sh.bin_xmin[chosen];
        sh.b_hi = sh.bin_xmax[chosen];
        if (pass + 1 == kKeyPasses) {
          // Every token in this bin has the same weight q > 0: the walk stops at the first of
          // them (in id order) where the count or the weight reaches its target.
          const long long ties = sh.bin_count[chosen];
          long long need = count_target - count_above;
          if (need > ties) need = ties;
          if (use_mass && mass_target > mass_above) {
            const uint64_t q = FromLogKey(sh.b_prefix);
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
  const uint64_t key = FromLogKey(prefix);
  const int id = NthTie(d, u, key, lo, hi, need, sh);
  return Cut{key, id, cut_xlo};
}

// Rank order: key descending, then id ascending; the padding (key 0, id kNoId) sorts last.
__device__ __forceinline__ bool RankBefore(uint64_t ka, int ia, uint64_t kb, int ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// Sorts sh.cand.keys/ids[0, n) (n <= kCap) in rank order (by_id false) or by id; pads to a power of
// two with (0, kNoId).
__device__ void BitonicSort(int n, bool by_id, Shared& sh) {
  int size = 1;
  while (size < n) size *= 2;
  for (int j = n + threadIdx.x; j < size; j += kThreads) {
    sh.cand.keys[j] = 0;
    sh.cand.ids[j] = kNoId;
  }
  __syncthreads();
  for (int len = 2; len <= size; len *= 2) {
    for (int stride = len / 2; stride > 0; stride /= 2) {
      for (int t = threadIdx.x; t < size / 2; t += kThreads) {
        const int i = 2 * t - (t & (stride - 1));
        const int j = i + stride;
        const bool up = (i & len) == 0;
        const bool j_first =
            by_id ? sh.cand.ids[j] < sh.cand.ids[i]
                  : RankBefore(sh.cand.keys[j], sh.cand.ids[j], sh.cand.keys[i], sh.cand.ids[i]);
        const bool i_first =
            by_id ? sh.cand.ids[i] < sh.cand.ids[j]
                  : RankBefore(sh.cand.keys[i], sh.cand.ids[i], sh.cand.keys[j], sh.cand.ids[j]);
        if (up ? j_first : i_first) {
          const uint64_t k = sh.cand.keys[i];
          sh.cand.keys[i] = sh.cand.keys[j];
          sh.cand.keys[j] = k;
          const int id = sh.cand.ids[i];
          sh.cand.ids[i] = sh.cand.ids[j];
          sh.cand.ids[j] = id;
        }
      }
      __syncthreads();
    }
  }
}

// Copies the members of `c` (at most kCap of them) into sh.cand.keys/ids; returns their number.
__device__ int Gather(const Dist& d, const Cut& c, Shared& sh) {
  if (threadIdx.x == 0) sh.count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < d.vocab; i += kThreads) {
    uint64_t q;
    if (Member(d, c, d.row[i], i, &q)) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < kCap) {
        sh.cand.keys[slot] = q;
        sh.cand.ids[slot] = i;
      }
    }
  }
  __syncthreads();
  const int n = min(sh.count, kCap);
  __syncthreads();
  return n;
}

// Inclusive scan of one value per thread in thread order; *total is the block's sum.
__device__ uint64_t BlockInclusiveScan(uint64_t v, Shared& sh, uint64_t* total) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long incl = v;
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    const unsigned long long u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) sh.warp_ll[warp] = static_cast<long long>(incl);
  __syncthreads();
  unsigned long long before = 0, all = 0;
  for (int w = 0; w < kWarps; ++w) {
    const unsigned long long t = static_cast<unsigned long long>(sh.warp_ll[w]);
    if (w < warp) before += t;
    all += t;
  }
  __syncthreads();
  *total = all;
  return incl + before;
}

// The draw over a kept set sorted by id in sh.cand.keys/ids[0, n): the first token whose inclusive
// prefix weight exceeds floor(u * total); kNoId when nothing weighs. Thread t holds entries 2t and
// 2t + 1; the token's index is the number of entries whose prefix does not exceed the threshold.
__device__ int DrawSorted(int n, uint64_t bits, Shared& sh) {
  const int j0 = 2 * threadIdx.x, j1 = j0 + 1;
  const uint64_t v0 = j0 < n ? sh.cand.keys[j0] : 0;
  const uint64_t v1 = j1 < n ? sh.cand.keys[j1] : 0;
  uint64_t total;
  const uint64_t incl1 = BlockInclusiveScan(v0 + v1, sh, &total);
  const uint64_t incl0 = incl1 - v1;
  if (total == 0) return kNoId;  // no token has a weight (logits all -inf or NaN)
  const uint64_t threshold = sm::DrawThreshold(bits, total);
  const int below = __syncthreads_count(j0 < n && incl0 <= threshold) +
                    __syncthreads_count(j1 < n && incl1 <= threshold);
  return sh.cand.ids[below];  // below < n: the prefix reaches total > threshold
}

// Counts the members of `c` and writes their total weight per tile to sh.tile_mass.
__device__ long long TileCountMass(const Dist& d, const Cut& c, Shared& sh) {
  for (int t = threadIdx.x; t < kMaxTiles; t += kThreads) sh.tile_mass[t] = 0;
  __syncthreads();
  const int lane = threadIdx.x % 32;
  long long n = 0;
  for (int base = 0, tile = 0; base < d.vocab; base += kThreads, ++tile) {
    const int i = base + threadIdx.x;
    uint64_t q = 0;
    if (i < d.vocab && Member(d, c, d.row[i], i, &q)) {
      ++n;
    } else {
      q = 0;
    }
    const uint64_t s = WarpSumWeight(q);
    if (lane == 0 && s != 0) atomicAdd(&sh.tile_mass[tile], static_cast<unsigned long long>(s));
  }
  return BlockSumLL(n, sh);  // its barriers also order the atomics before any reader
}

// The draw in id order over the members of `c`, whose total weights per tile are in
// sh.tile_mass: the first member whose inclusive prefix weight exceeds floor(u * total). Warp 0
// finds the tile, one block scan over its kThreads ids the token. kNoId when nothing weighs.
__device__ int TileDraw(const Dist& d, const Cut& c, uint64_t bits, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int tiles = (d.vocab + kThreads - 1) / kThreads;
  if (warp == 0) {
    constexpr int kPerLane = kMaxTiles / 32;
    unsigned long long local = 0;
    for (int j = 0; j < kPerLane; ++j) {
      const int t = lane * kPerLane + j;
      if (t < tiles) local += sh.tile_mass[t];
    }
    unsigned long long incl = local;
#pragma unroll
    for (int o = 1; o < 32; o *= 2) {
      const unsigned long long v = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += v;
    }
    const uint64_t total = __shfl_sync(0xffffffffu, incl, 31);
    const uint64_t threshold = sm::DrawThreshold(bits, total);
    const unsigned hit = __ballot_sync(0xffffffffu, incl > threshold);
    if (lane == 0) sh.b_int = -1;
    __syncwarp();
    if (hit != 0 && lane == __ffs(static_cast<int>(hit)) - 1) {
      unsigned long long cum = incl - local;
      for (int j = 0; j < kPerLane; ++j) {
        const int t = lane * kPerLane + j;
        const unsigned long long m = t < tiles ? sh.tile_mass[t] : 0;
        if (cum + m > threshold) {
          sh.b_int = t;
          sh.b_prefix = threshold - cum;
          break;
        }
        cum += m;
      }
    }
  }
  __syncthreads();
  const int tile = sh.b_int;
  const uint64_t rem = sh.b_prefix;
  __syncthreads();
  if (tile < 0) return kNoId;
  // Inclusive block scan of the tile's member weights: the token is the first member whose prefix
  // passes `rem`, so its offset is the number of prefixes that do not.
  const int i = tile * kThreads + threadIdx.x;
  uint64_t q = 0;
  if (i >= d.vocab || !Member(d, c, d.row[i], i, &q)) q = 0;
  uint64_t tile_total;
  const uint64_t incl = BlockInclusiveScan(q, sh, &tile_total);
  return tile * kThreads + __syncthreads_count(incl <= rem);
}

// What the pass over the whole row found.
struct RowScan {
  double log_sum;      // log of the raw softmax denominator, plus the max logit
  long long n_elig;    // eligible tokens (when weights were computed)
  uint64_t mass_elig;  // their total weight
  int max_level;       // deepest level with at most kCap tokens at or above it; -1 if none
};

// The pass over the whole row (step 2 of the header). `weights`: count and total the eligible
// tokens; `tiles`: also their totals per tile; `levels`: count the tokens per level.
__device__ RowScan ScanRow(const Dist& d, float xmax, bool weights, bool tiles, bool levels,
                           float scale, Shared& sh) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (tiles) {
    for (int t = threadIdx.x; t < kMaxTiles; t += kThreads) sh.tile_mass[t] = 0;
  }
  if (levels) {
    for (int l = 0; l < kLevels; ++l) sh.level_count[l][threadIdx.x] = 0;  // own column only
  }
  __syncthreads();
  double raw = 0.0;
  long long n = 0;
  long long m = 0;  // < 2^59
  for (int base = 0, tile = 0; base < d.vocab; base += kThreads, ++tile) {
    const int i = base + threadIdx.x;
    uint64_t q = 0;
    if (i < d.vocab) {
      const float x = d.row[i];
      raw += exp(static_cast<double>(x) - static_cast<double>(xmax));
      if (levels) {
        const int l = Level(x, xmax, scale);
        if (l < kLevels) ++sh.level_count[l][threadIdx.x];
      }
      if (weights) {
        const uint64_t w = d.Weight(x);
        if (d.Eligible(w)) {
          q = w;
          ++n;
          m += static_cast<long long>(w);
        }
      }
    }
    if (tiles) {
      const uint64_t s = WarpSumWeight(q);
      if (lane == 0 && s != 0) atomicAdd(&sh.tile_mass[tile], static_cast<unsigned long long>(s));
    }
  }
  RowScan out;
  out.log_sum = log(BlockSum(raw, sh)) + static_cast<double>(xmax);
  out.n_elig = 0;
  out.mass_elig = 0;
  if (weights) {
    out.n_elig = BlockSumLL(n, sh);
    out.mass_elig = static_cast<uint64_t>(BlockSumLL(m, sh));
  }
  out.max_level = -1;
  if (levels) {
    // Warp w sums half of level w / 2 (BlockSum's barriers ordered the counts before this).
    const int l = warp / 2, half = warp % 2;
    unsigned s = 0;
    for (int t = half * (kThreads / 2) + lane; t < (half + 1) * (kThreads / 2); t += 32) {
      s += sh.level_count[l][t];
    }
    s = __reduce_add_sync(0xffffffffu, s);
    if (lane == 0) sh.level_half[warp] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
      int deepest = -1;
      unsigned cum = 0;
      for (int k = 0; k < kLevels; ++k) {
        cum += sh.level_half[2 * k] + sh.level_half[2 * k + 1];
        if (cum > static_cast<unsigned>(kCap)) break;
        if (cum > 0) deepest = k;
      }
      sh.b_int = deepest;
    }
    __syncthreads();
    out.max_level = sh.b_int;
    __syncthreads();  // the level counts share storage with sh.cand
  }
  return out;
}

// Gathers the tokens of level <= max_level (at most kCap by ScanRow's counts) into sh.cand, with
// weight 0 for those below min_p; returns their number and sets *q_out to a bound on the weight
// of every other token (0 when no other token has a logit that is not NaN).
__device__ int GatherTop(const Dist& d, float xmax, float scale, int max_level, Shared& sh,
                         uint64_t* q_out) {
  if (threadIdx.x == 0) {
    sh.count = 0;
    sh.out_key = 0;
  }
  __syncthreads();
  uint32_t out_key = 0;  // below OrderKey of any non-NaN float
  for (int i = threadIdx.x; i < d.vocab; i += kThreads) {
    const float x = d.row[i];
    if (Level(x, xmax, scale) <= max_level) {
      const int slot = atomicAdd(&sh.count, 1);
      if (slot < kCap) {
        const uint64_t q = d.Weight(x);
        sh.cand.keys[slot] = d.Eligible(q) ? q : 0;
        sh.cand.ids[slot] = i;
      }
    } else if (!isnan(x)) {
      out_key = max(out_key, OrderKey(x));
    }
  }
  out_key = __reduce_max_sync(0xffffffffu, out_key);
  if (threadIdx.x % 32 == 0) atomicMax(&sh.out_key, out_key);
  __syncthreads();
  const int n = sh.count;
  out_key = sh.out_key;
  __syncthreads();
  // Outside tokens have logits <= x_out, so weights <= TokenWeight(x_out) + 1.
  *q_out = out_key == 0 ? 0 : d.Weight(KeyToFloat(out_key)) + 2;
  return n;
}

// Step 4 of the header: top_k / top_p on the candidate set. Returns false (and leaves *token)
// when the set cannot decide the row.
__device__ __noinline__ bool SampleTop(const Dist& d, const SamplingRow& prm, bool top_k_on,
                                       float xmax, float scale, const RowScan& scan, uint64_t bits,
                                       Shared& sh, int* token) {
  uint64_t q_out;
  const int n = GatherTop(d, xmax, scale, scan.max_level, sh, &q_out);
  if (n > kCap) return false;  // not expected: the counts came from the same function
  BitonicSort(n, /*by_id=*/false, sh);
  // Thread t holds ranks 2t and 2t + 1; the eligible ones (weight > 0) come first.
  const int j0 = 2 * threadIdx.x, j1 = j0 + 1;
  const uint64_t k0 = j0 < n ? sh.cand.keys[j0] : 0;
  const uint64_t k1 = j1 < n ? sh.cand.keys[j1] : 0;
  const int n_elig = __syncthreads_count(k0 != 0) + __syncthreads_count(k1 != 0);
  // The rank order's candidates: sh.cand[0, order_n).
  int order_n = n_elig;
  bool decided = true;
  if (top_k_on) {
    if (n_elig >= prm.top_k) {
      order_n = prm.top_k;
      decided = sh.cand.keys[order_n - 1] > q_out;
    } else {
      decided = q_out < d.min_weight;  // no eligible token outside
    }
  }
  const uint64_t v0 = j0 < order_n ? k0 : 0;
  const uint64_t v1 = j1 < order_n ? k1 : 0;
  uint64_t order_mass;
  const uint64_t incl1 = BlockInclusiveScan(v0 + v1, sh, &order_mass);
  const uint64_t incl0 = incl1 - v1;
  const uint64_t target = sm::TopPTarget(prm.top_p, top_k_on ? order_mass : scan.mass_elig);
  // The walk stops at the first rank whose prefix weight reaches the target.
  const int below = __syncthreads_count(j0 < order_n && incl0 < target) +
                    __syncthreads_count(j1 < order_n && incl1 < target);
  const bool reached = below < order_n;
  const int keep = reached ? below + 1 : order_n;
  if (!top_k_on) {
    // Every token ranked above the last kept one must be a candidate.
    decided = reached ? sh.cand.keys[keep - 1] > q_out : q_out < d.min_weight;
  }
  if (!decided) return false;
  __syncthreads();  // every thread has read sh.cand before the sort rewrites it
  BitonicSort(keep, /*by_id=*/true, sh);
  *token = DrawSorted(keep, bits, sh);
  return true;
}

// Step 5 of the header: the general path for rows with top_k / top_p.
__device__ __noinline__ int SampleGeneral(const Dist& d, const SamplingRow& prm, bool top_k_on,
                                          const RowScan& scan, uint64_t bits, Shared& sh) {
  const Cut all{0, kNoId, 0};
  Cut order = all;
  long long order_n = scan.n_elig;
  uint64_t order_mass = scan.mass_elig;
  if (top_k_on) {
    order = Select(d, all, prm.top_k, false, 0, sh);
    CountMass(d, order, sh, &order_n, &order_mass);
  }
  const uint64_t target = sm::TopPTarget(prm.top_p, order_mass);
  Cut kept = order;
  if (order_n <= kCap) {
    const int n = Gather(d, order, sh);
    BitonicSort(n, /*by_id=*/false, sh);
    if (threadIdx.x == 0) {
      uint64_t kept_mass = 0;
      int keep = 0;
      for (int j = 0; j < n; ++j) {
        keep = j + 1;
        kept_mass += sh.cand.keys[j];
        if (kept_mass >= target) break;
      }
      sh.b_int = keep;
    }
    __syncthreads();
    const int kept_n = sh.b_int;
    __syncthreads();
    BitonicSort(kept_n, /*by_id=*/true, sh);
    return DrawSorted(kept_n, bits, sh);
  }
  kept = Select(d, order, order_n, true, target, sh);
  const long long n = TileCountMass(d, kept, sh);
  if (n <= kCap) {
    const int m = Gather(d, kept, sh);
    BitonicSort(m, /*by_id=*/true, sh);
    return DrawSorted(m, bits, sh);
  }
  return TileDraw(d, kept, bits, sh);
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
  const bool top_k_on = prm.top_k > 0 && prm.top_k < vocab;
  const bool filtered = top_k_on || prm.top_p < 1.0f;

  // Greedy rows only read row/vocab of `d`.
  const double temperature = greedy ? 1.0 : static_cast<double>(prm.temperature);
  const Dist d{row, vocab, temperature, sm::ScaledLogit(xmax, temperature),
               sm::MinPWeight(prm.min_p)};
  const bool levels = !greedy && filtered && isfinite(xmax);
  const float scale = static_cast<float>(1.0 / (30.0 * temperature));
  const RowScan scan = ScanRow(d, xmax, /*weights=*/!greedy && !top_k_on,
                               /*tiles=*/!greedy && !filtered, levels, scale, sh);

  int token = argmax;
  if (!greedy) {
    const uint64_t bits = sm::UniformBits(prm.seed, prm.step);
    if (!filtered) {
      token = TileDraw(d, Cut{0, kNoId, 0}, bits, sh);
    } else if (!(levels && scan.max_level >= 0 &&
                 SampleTop(d, prm, top_k_on, xmax, scale, scan, bits, sh, &token))) {
      token = SampleGeneral(d, prm, top_k_on, scan, bits, sh);
    }
  }
  // Degenerate rows (no finite logit) fall back to the argmax; the logprob is then NaN or -inf.
  if (token < 0 || token >= vocab) token = argmax;
  if (threadIdx.x == 0) {
    tokens[r] = token;
    logprobs[r] = static_cast<float>(static_cast<double>(row[token]) - scan.log_sum);
  }
}

}  // namespace

cudaError_t LaunchSamplingRaw(const SamplingArgs& a, cudaStream_t stream) {
  SamplingKernel<<<a.rows, kThreads, 0, stream>>>(a.logits, a.params, a.vocab, a.tokens,
                                                  a.logprobs);
  return cudaGetLastError();
}

}  // namespace tandem::cuda::internal
