// cast's conversions to and from the 16-bit float formats (docs/kernels.md, "Core kernels"), written once
// for the host and the device: the CUDA cast (cuda.cu) calls them, and test/unit/kernels/
// CastMathTest.cpp checks them against support/DType.h's conversions and the CPU cast kernel
// (exhaustively for the 16-bit sources). Integer and bit operations, IEEE conversions and an exact
// power-of-two scaling only, so they give the same bits on both. Plain C++ when not compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::cast {

DGEMMA_HOST_DEVICE inline uint32_t bitsOfFloat(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

DGEMMA_HOST_DEVICE inline float floatOfBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// bf16 <-> f32: round to nearest even, NaN quietened (support/DType.h's f32ToBf16Bits).
DGEMMA_HOST_DEVICE inline uint16_t f32ToBf16Bits(float value) {
  const uint32_t bits = bitsOfFloat(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

DGEMMA_HOST_DEVICE inline float bf16BitsToF32(uint16_t half) { return floatOfBits(static_cast<uint32_t>(half) << 16); }

// IEEE binary16 <-> f32, round to nearest even with subnormals; every NaN becomes the quiet NaN of
// its sign (support/DType's f32ToF16Bits and f16BitsToF32).
DGEMMA_HOST_DEVICE inline uint16_t f32ToF16Bits(float value) {
  const uint32_t bits = bitsOfFloat(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t absBits = bits & 0x7fffffffu;
  if (absBits > 0x7f800000u) return sign | 0x7e00u;  // NaN
  if (absBits >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: infinity
  if (absBits < 0x38800000u)                           // below the smallest normal: subnormal
    // The magnitude in units of 2^-24 (an exact scaling), rounded to nearest even.
    return sign | static_cast<uint16_t>(rintf(floatOfBits(absBits) * 16777216.0f));
  const uint32_t mantissa = absBits & 0x007fffffu;
  const int32_t exponent = static_cast<int32_t>(absBits >> 23) - 127 + 15;
  uint32_t half = (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
  const uint32_t remainder = mantissa & 0x1fffu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (half & 1u))) ++half;  // may carry into exponent
  return sign | static_cast<uint16_t>(half);
}

DGEMMA_HOST_DEVICE inline float f16BitsToF32(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t exponent = (half >> 10) & 0x1fu, mantissa = half & 0x3ffu;
  uint32_t magnitude;
  if (exponent == 0)
    magnitude = bitsOfFloat(static_cast<float>(mantissa) * 5.9604644775390625e-8f);  // · 2^-24, exact
  else if (exponent == 31)
    magnitude = mantissa ? 0x7fc00000u : 0x7f800000u;
  else
    magnitude = ((exponent - 15 + 127) << 23) | (mantissa << 13);
  return floatOfBits(magnitude | sign);
}

// f64 -> f32 with round-to-odd: an inexact result keeps a sticky low bit, so rounding it on to bf16 or
// f16 (at least two bits narrower) is the correctly rounded f64 (the CPU cast's roundToOddF32).
DGEMMA_HOST_DEVICE inline float roundToOddF32(double value) {
  const float nearest = static_cast<float>(value);
  if (value != value || static_cast<double>(nearest) == value) return nearest;
  uint32_t bits = bitsOfFloat(nearest);
  // The f32 neighbour toward zero: one unit less in magnitude when nearest rounded away from zero
  // (nearest is then nonzero; from infinity that is the largest finite f32).
  if (fabs(static_cast<double>(nearest)) > fabs(value)) --bits;
  return floatOfBits(bits | 1u);
}

DGEMMA_HOST_DEVICE inline uint16_t f64ToBf16Bits(double value) { return f32ToBf16Bits(roundToOddF32(value)); }
DGEMMA_HOST_DEVICE inline uint16_t f64ToF16Bits(double value) { return f32ToF16Bits(roundToOddF32(value)); }

}  // namespace dgemma::cast
