// Half (IEEE 754 binary16) and BFloat16 (the top 16 bits of an f32) as plain 16-bit storage types.
//
// Arithmetic is never done in 16 bits on the CPU: kernels convert to float, compute, and round back
// (round-to-nearest-even), which is also what the GPU's f32-accumulating kernels do. The bit layouts
// match CUDA's __half and __nv_bfloat16, so device buffers can be reinterpreted without conversion.
#pragma once
#include <cstdint>
#include <cmath>
#include <cstring>

namespace reel {

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits.
inline uint16_t float_to_half_bits(float f) {
  uint32_t x = float_bits(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u) return uint16_t(sign | (mag > 0x7f800000u ? 0x7e00u : 0x7c00u));  // NaN/inf
  if (mag >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds past 65504: overflow to inf
  if (mag < 0x38800000u) {  // below 2^-14: a subnormal half (or zero) in units of 2^-24
    // Scaling by 2^24 is exact; nearbyint rounds to nearest even. 1024 lands on the smallest normal.
    float units = bits_float(mag) * 16777216.0f;
    return uint16_t(sign | uint32_t(std::nearbyint(units)));
  }
  uint32_t h = ((mag - 0x38000000u) >> 13);  // rebias exponent 127 -> 15, drop 13 mantissa bits
  uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1))) h++;
  return uint16_t(sign | h);
}

inline float half_bits_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_float(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp == 0) {
    if (mant == 0) return bits_float(sign);
    float v = float(mant) * (1.0f / 16777216.0f);  // mant * 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((exp + 112) << 23) | (mant << 13));
}

inline uint16_t float_to_bf16_bits(float f) {
  uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return uint16_t((x >> 16) | 0x40u);  // keep NaN a NaN
  x += 0x7fffu + ((x >> 16) & 1u);  // round to nearest even
  return uint16_t(x >> 16);
}
inline float bf16_bits_to_float(uint16_t b) { return bits_float(uint32_t(b) << 16); }

struct Half {
  uint16_t bits = 0;
  Half() = default;
  explicit Half(float f) : bits(float_to_half_bits(f)) {}
  explicit operator float() const { return half_bits_to_float(bits); }
  static Half from_bits(uint16_t b) { Half h; h.bits = b; return h; }
};

struct BFloat16 {
  uint16_t bits = 0;
  BFloat16() = default;
  explicit BFloat16(float f) : bits(float_to_bf16_bits(f)) {}
  explicit operator float() const { return bf16_bits_to_float(bits); }
  static BFloat16 from_bits(uint16_t b) { BFloat16 h; h.bits = b; return h; }
};

}  // namespace reel
