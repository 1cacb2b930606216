// float16 and bfloat16 conversions on their bits, written once for the CPU's Half and BFloat16
// (include/kiln/runtime/dtype.h, runtime/basic_types.cc) and the GPU kernels (codegen/cu/*.cu),
// so both devices round alike: to nearest even, NaN kept a NaN, overflow to infinity. Plain C++
// without the standard library: the GPU side has none.
#pragma once

#include "kiln/runtime/host_device.h"

namespace kiln::f16 {

KILN_HOST_DEVICE inline unsigned short FloatToHalfBits(float f) {
  const unsigned x = __builtin_bit_cast(unsigned, f);
  const unsigned sign = (x >> 16) & 0x8000u;
  unsigned mant = x & 0x007fffffu;
  const int exp = static_cast<int>((x >> 23) & 0xff);
  if (exp == 0xff) return static_cast<unsigned short>(sign | 0x7c00u | (mant ? 0x200u : 0u));  // inf, NaN
  const int e = exp - 127 + 15;
  if (e >= 0x1f) return static_cast<unsigned short>(sign | 0x7c00u);  // overflow to inf
  if (e <= 0) {                                                        // subnormal or zero
    if (e < -10) return static_cast<unsigned short>(sign);
    mant |= 0x00800000u;
    const unsigned shift = static_cast<unsigned>(14 - e), rem = mant & ((1u << shift) - 1),
                   halfway = 1u << (shift - 1);
    unsigned half_mant = mant >> shift;
    if (rem > halfway || (rem == halfway && (half_mant & 1u))) ++half_mant;
    return static_cast<unsigned short>(sign | half_mant);
  }
  unsigned half = sign | (static_cast<unsigned>(e) << 10) | (mant >> 13);
  const unsigned rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) ++half;  // may carry into the exponent: fine
  return static_cast<unsigned short>(half);
}

KILN_HOST_DEVICE inline float HalfBitsToFloat(unsigned short h) {
  const unsigned sign = (static_cast<unsigned>(h) & 0x8000u) << 16, exp = (h >> 10) & 0x1fu;
  unsigned mant = h & 0x3ffu, out;
  if (exp == 0) {
    if (mant == 0) {
      out = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while (!(mant & 0x400u));
      out = sign | (static_cast<unsigned>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 0x1f) {
    out = sign | 0x7f800000u | (mant << 13);
  } else {
    out = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return __builtin_bit_cast(float, out);
}

KILN_HOST_DEVICE inline unsigned short FloatToBFloat16Bits(float f) {
  unsigned u = __builtin_bit_cast(unsigned, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<unsigned short>(u >> 16);
}

KILN_HOST_DEVICE inline float BFloat16BitsToFloat(unsigned short b) {
  return __builtin_bit_cast(float, static_cast<unsigned>(b) << 16);
}

}  // namespace kiln::f16
