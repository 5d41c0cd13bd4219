#pragma once
// The arithmetic that the CPU sampler (sampler.cc) and the GPU sampler
// (runtime/kernels/cuda/sampling.cu) share, so that both pick the same token by construction.
//
// Each token's weight is an integer: q_i = llround(w_i * 2^40) with w_i = exp(x_i / T - max_j x_j /
// T) in (0, 1] (the max token has q = 2^40), so probabilities have a resolution of 2^-40 relative
// to the most likely token and tokens with w_i < 2^-41 get weight 0 (never sampled). min_p, top_k,
// top_p and the inverse-CDF draw then work on these integers: sums of up to 2^18 weights stay
// below 2^59, and integer addition does not depend on the order of summation, so a GPU tree sum
// equals the CPU's left-to-right sum.
//
// exp() here is our own: a Cody-Waite reduction and a degree-13 polynomial (relative error below
// 1e-15 on [-30, 0]) written only with correctly rounded double +, -, *, division, rint, llround
// and exact power-of-two scaling. Every operation is IEEE round-to-nearest on both sides (device
// code uses the __d*_rn intrinsics, which nvcc never fuses; host callers must compile with
// -ffp-contract=off, which tandem_sampling does), so q_i is bit-identical on the CPU and the GPU.
//
// Header-only so that one copy of each formula serves both compilers; host code includes it from
// sampler.cc only. Pure functions; thread-safe.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_SAMPLING_HD __host__ __device__ __forceinline__
#else
#define TANDEM_SAMPLING_HD inline
#endif

namespace tandem::sampling_math {

inline constexpr int kWeightBits = 40;
inline constexpr uint64_t kWeightOne = uint64_t{1} << kWeightBits;  // the max token's weight
// Below this scaled logit the weight rounds to 0 (exp(-30) * 2^40 < 0.11).
inline constexpr double kMinExponent = -30.0;

namespace internal {

// Correctly rounded operations that no compiler may fuse into an FMA.
TANDEM_SAMPLING_HD double Add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
TANDEM_SAMPLING_HD double Sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
TANDEM_SAMPLING_HD double Mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
TANDEM_SAMPLING_HD double Div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}
TANDEM_SAMPLING_HD double Ceil(double a) {
#if defined(__CUDA_ARCH__)
  return ceil(a);
#else
  return std::ceil(a);
#endif
}
// Round to the nearest integer, ties to even.
TANDEM_SAMPLING_HD double RoundEven(double a) {
#if defined(__CUDA_ARCH__)
  return rint(a);
#else
  return std::nearbyint(a);
#endif
}
// Round to the nearest integer, ties away from zero.
TANDEM_SAMPLING_HD int64_t RoundAway(double a) {
#if defined(__CUDA_ARCH__)
  return llround(a);
#else
  return std::llround(a);
#endif
}
// 2^k for k in [-1022, 1023], exactly.
TANDEM_SAMPLING_HD double Pow2(int k) {
  const uint64_t bits = static_cast<uint64_t>(1023 + k) << 52;
#if defined(__CUDA_ARCH__)
  return __longlong_as_double(static_cast<long long>(bits));
#else
  double d;
  std::memcpy(&d, &bits, sizeof(d));
  return d;
#endif
}
// floor(a * b / 2^64).
TANDEM_SAMPLING_HD uint64_t MulHi(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(a) * b) >> 64);
#endif
}

TANDEM_SAMPLING_HD uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace internal

// 53 random bits from (seed, step) with a splitmix64-based counter RNG; UniformFromSeed (sampler.h)
// is this times 2^-53.
TANDEM_SAMPLING_HD uint64_t UniformBits(uint64_t seed, uint64_t step) {
  using internal::SplitMix64;
  return SplitMix64(SplitMix64(seed) ^ SplitMix64(step + 0x632be59bd9b4e019ULL)) >> 11;
}

// floor(u * total) for u = bits * 2^-53 in [0, 1): the inverse-CDF draw picks the first token (in
// id order) whose inclusive prefix sum of weights exceeds this. Exact; < total when total > 0.
TANDEM_SAMPLING_HD uint64_t DrawThreshold(uint64_t bits, uint64_t total) {
  return internal::MulHi(bits << 11, total);
}

// max_j x_j / T: the CPU computes it over every token, the GPU from the max logit; division by
// T > 0 is monotone, so the two agree.
TANDEM_SAMPLING_HD double ScaledLogit(float x, double temperature) {
  return internal::Div(static_cast<double>(x), temperature);
}

// q = llround(exp(a) * 2^40) for a scaled logit minus the max scaled logit (a <= 0; -inf gives 0).
TANDEM_SAMPLING_HD uint64_t QuantizedWeight(double a) {
  using internal::Add;
  using internal::Mul;
  using internal::Sub;
  if (!(a >= kMinExponent)) return 0;
  constexpr double kLog2e = 0x1.71547652b82fep0;
  constexpr double kLn2Hi = 0x1.62e42feep-1;  // 32 significant bits: k * kLn2Hi is exact
  constexpr double kLn2Lo = 0x1.a39ef35793c76p-33;
  const double k = internal::RoundEven(Mul(a, kLog2e));          // in [-44, 0]
  const double r = Sub(Sub(a, Mul(k, kLn2Hi)), Mul(k, kLn2Lo));  // |r| <= ~0.347
  // exp(r) by Horner on the Taylor series through r^13 (truncation < 2e-17); the coefficients
  // are constant-folded, so both compilers see the same doubles.
  constexpr double kCoef[] = {1.0 / 6227020800.0,
                              1.0 / 479001600.0,
                              1.0 / 39916800.0,
                              1.0 / 3628800.0,
                              1.0 / 362880.0,
                              1.0 / 40320.0,
                              1.0 / 5040.0,
                              1.0 / 720.0,
                              1.0 / 120.0,
                              1.0 / 24.0,
                              1.0 / 6.0,
                              0.5,
                              1.0,
                              1.0};
  double p = kCoef[0];
  for (int i = 1; i < 14; ++i) p = Add(Mul(p, r), kCoef[i]);
  const double w = Mul(p, internal::Pow2(static_cast<int>(k) + kWeightBits));  // exact scaling
  return static_cast<uint64_t>(internal::RoundAway(w));
}

// The weight of a token with logit x, given max_scaled = ScaledLogit(max logit, T).
TANDEM_SAMPLING_HD uint64_t TokenWeight(float x, double temperature, double max_scaled) {
  return QuantizedWeight(internal::Sub(ScaledLogit(x, temperature), max_scaled));
}

// min_p keeps q >= MinPWeight(min_p) (= ceil(min_p * 2^40), at least 1): w >= min_p * max w.
TANDEM_SAMPLING_HD uint64_t MinPWeight(float min_p) {
  const double t =
      internal::Ceil(internal::Mul(static_cast<double>(min_p), static_cast<double>(kWeightOne)));
  return t < 1.0 ? 1 : static_cast<uint64_t>(t);
}

// top_p keeps the shortest rank-order prefix whose weight reaches this: ceil(top_p * total), the
// product rounded to double; exactly total when top_p >= 1.
TANDEM_SAMPLING_HD uint64_t TopPTarget(float top_p, uint64_t total) {
  if (top_p >= 1.0f) return total;
  return static_cast<uint64_t>(
      internal::Ceil(internal::Mul(static_cast<double>(top_p), static_cast<double>(total))));
}

}  // namespace tandem::sampling_math
