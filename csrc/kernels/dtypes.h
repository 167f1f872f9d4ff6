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

inline float to_float(BFloat16 h) { return bits_to_float(uint32_t(h.bits) << 16); }
inline BFloat16 bf16_from_float(float f) {
  uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return BFloat16{uint16_t(u >> 16)};
}

inline float to_float(Half h) {
  const uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  const uint32_t exp = (h.bits >> 10) & 0x1fu;
  const uint32_t mant = h.bits & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24
    const float v = float(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return bits_to_float(sign | 0x7f800000u | (mant << 13));
  return bits_to_float(sign | ((exp + 112u) << 23) | (mant << 13));
}
inline Half half_from_float(float f) {
  uint32_t u = float_to_bits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u >= 0x7f800000u) return Half{uint16_t(sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u))};
  if (u >= 0x477ff000u) return Half{uint16_t(sign | 0x7c00u)};  // rounds past 65504: inf
  if (u < 0x38800000u) {  // below 2^-14: subnormal half, round(v * 2^24) to even
    const float v = std::nearbyint(bits_to_float(u) * 16777216.0f);
    return Half{uint16_t(sign | uint16_t(v))};
  }
  u += 0xfffu + ((u >> 13) & 1u);
  return Half{uint16_t(sign | ((u - (112u << 23)) >> 13))};
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
