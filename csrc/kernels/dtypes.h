// Storage types for half and bfloat16 on the host, layout-compatible with
// c10::Half / c10::BFloat16 (a uint16_t), with round-to-nearest-even
// conversions.  No framework headers, so the CPU kernels and their tests build
// without libtorch.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace fln {

struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t float_to_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

// The conversions are written as selects, without branches, so that loops
// over them vectorize.
inline float to_float(BFloat16 h) { return bits_to_float(uint32_t(h.bits) << 16); }
inline BFloat16 bf16_from_float(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x40u;
  return BFloat16{uint16_t((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded)};
}

// Exponent and mantissa moved to the float's places and rebiased (15 -> 127);
// infinity and NaN take the full exponent; zero and subnormals (mant * 2^-24)
// come exactly from one float subtraction: 2^-14 (1 + mant / 1024) - 2^-14.
inline float to_float(Half h) {
  const uint32_t magnitude = uint32_t(h.bits & 0x7fffu) << 13;
  const uint32_t exponent = magnitude & 0x0f800000u;
  const uint32_t normal = magnitude + (exponent == 0x0f800000u ? 224u << 23 : 112u << 23);
  const float subnormal = bits_to_float(magnitude + (113u << 23)) - bits_to_float(113u << 23);
  const uint32_t unsigned_bits = exponent == 0 ? float_to_bits(subnormal) : normal;
  return bits_to_float(unsigned_bits | (uint32_t(h.bits & 0x8000u) << 16));
}
// Round to nearest even.  Normal halves: rebias, then round at bit 13.
// Subnormal halves (|f| < 2^-14): adding 0.5f, whose ulp is 2^-24, rounds
// |f| to a multiple of 2^-24 and leaves that multiple in the low bits.
// Past 65504 + half an ulp: infinity; NaN: the quiet NaN 0x7e00.
inline Half half_from_float(float f) {
  const uint32_t u = float_to_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  const uint32_t normal = (a - (112u << 23) + 0xfffu + ((a >> 13) & 1u)) >> 13;
  const uint32_t subnormal = float_to_bits(bits_to_float(a) + 0.5f) - float_to_bits(0.5f);
  uint32_t r = a < (113u << 23) ? subnormal : normal;
  r = a >= 0x477ff000u ? 0x7c00u : r;
  r = a > 0x7f800000u ? 0x7e00u : r;
  return Half{uint16_t(sign | r)};
}

// Accumulation type: float for every storage type but double.
template <typename T> struct AccType { using type = float; };
template <> struct AccType<double> { using type = double; };
template <typename T> using acc_t = typename AccType<T>::type;

// Uniform load/store for the CPU kernels.
template <typename A> inline A load_as(float v) { return A(v); }
template <typename A> inline A load_as(double v) { return A(v); }
template <typename A> inline A load_as(Half v) { return A(to_float(v)); }
template <typename A> inline A load_as(BFloat16 v) { return A(to_float(v)); }

template <typename T> inline T store_as(float v) { return T(v); }
template <typename T> inline T store_as(double v) { return T(v); }
template <> inline Half store_as<Half>(float v) { return half_from_float(v); }
template <> inline BFloat16 store_as<BFloat16>(float v) { return bf16_from_float(v); }

}  // namespace fln
