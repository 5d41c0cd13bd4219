#pragma once
// Scalar conversions between IEEE float32 and the two 16-bit formats stored in model files:
// bfloat16 (1-8-7) and float16 (1-5-10). Float32 -> 16-bit rounds to nearest, ties to even;
// NaN stays NaN (quiet), infinities stay infinities, float16 overflow becomes infinity and tiny
// values become float16 subnormals. Pure functions on bit patterns: thread-safe, header-only.
//
// The float32 -> float16 subnormal path relies on the default floating-point rounding mode
// (round to nearest even), which Tandem never changes.

#include <cstdint>
#include <cstring>

namespace tandem {

inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float BitsToFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline float Bf16ToFloat(uint16_t h) { return BitsToFloat(static_cast<uint32_t>(h) << 16); }

inline uint16_t FloatToBf16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    // NaN: keep sign and top payload bits, force the quiet bit so truncation cannot give inf.
    return static_cast<uint16_t>((u >> 16) | 0x0040u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow carries into inf
  return static_cast<uint16_t>(u >> 16);
}

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in float32.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return BitsToFloat(sign | FloatBits(magnitude));
  }
  if (exponent == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t FloatToF16(float f) {
  uint32_t u = FloatBits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) {  // inf or NaN
    if (u == 0x7f800000u) return sign | 0x7c00u;
    return static_cast<uint16_t>(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
  }
  if (u >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to infinity
  if (u >= 0x38800000u) {                       // normal float16 range (>= 2^-14)
    const uint32_t mantissa_odd = (u >> 13) & 1u;
    u += 0xc8000fffu + mantissa_odd;  // rebias exponent (127 -> 15) and round to nearest even
    return static_cast<uint16_t>(sign | (u >> 13));
  }
  // Subnormal or zero: adding 0.5 puts the float16 subnormal step (2^-24) at float32's last
  // mantissa bit, so the hardware's round-to-nearest-even does the rounding.
  const float shifted = BitsToFloat(u) + 0.5f;
  return static_cast<uint16_t>(sign | (FloatBits(shifted) - 0x3f000000u));
}

}  // namespace tandem
