// The Gumbel noise of canvas_sample's categorical draw (docs/kernels.md, "canvas_sample"), shared by
// the CPU kernel and the CUDA kernel so that both choose the same id: every operation here is an
// IEEE-754 operation that rounds the same way on both (integer and bit operations, add, multiply,
// divide, and fma written out explicitly: no multiply is left that a compiler could contract into a
// neighbouring add). The log is therefore not libm's or libdevice's logf, whose last bits differ
// between the two; it is within a few ulp of the true log, which is far finer than the draw needs.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::canvas_sample {

// An upper bound of every gumbelNoise value: the largest u, 1 - 2^-24, gives -log(-log u) = 16.64.
// z + kGumbelNoiseBound < best means z + g < best for every word, so the CPU kernel skips the noise
// of logits that cannot win (rounding is monotone, so the float sums keep the order).
inline constexpr float kGumbelNoiseBound = 17.0f;

DGEMMA_HOST_DEVICE inline float fusedMultiplyAdd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return fmaf(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

// The natural log of a positive normal float: x = 2^e · m with m in [√½, √2), log m = 2 atanh(s) with
// s = (m − 1) / (m + 1), |s| <= 0.172, summed to s^9 (the first omitted term is below 3e-9 of the
// result).
DGEMMA_HOST_DEVICE inline float portableLog(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  uint32_t mantissaBits = (bits & 0x007fffffu) | 0x3f800000u;  // m in [1, 2)
  // m > √2 (0x3FB504F3 as f32; positive floats order like their bits) halves m and bumps e. Integer
  // arithmetic rather than a branch, so that a loop over this vectorises.
  const uint32_t aboveRootTwo = mantissaBits > 0x3fb504f3u ? 1u : 0u;
  mantissaBits -= aboveRootTwo << 23;
  const int32_t exponent = static_cast<int32_t>(bits >> 23) - 127 + static_cast<int32_t>(aboveRootTwo);
  float mantissa;
  std::memcpy(&mantissa, &mantissaBits, sizeof mantissa);
  const float s = (mantissa - 1.0f) / (mantissa + 1.0f);
  const float s2 = s * s;
  float series = fusedMultiplyAdd(s2, 1.0f / 9.0f, 1.0f / 7.0f);
  series = fusedMultiplyAdd(s2, series, 1.0f / 5.0f);
  series = fusedMultiplyAdd(s2, series, 1.0f / 3.0f);
  series = fusedMultiplyAdd(s2, series, 1.0f);
  const float logMantissa = (s + s) * series;
  return fusedMultiplyAdd(static_cast<float>(exponent), 0.693147182f, logMantissa);
}

// u in the open interval (0, 1) from a Philox word: the top 23 bits k give u = (2k + 1) · 2^-24, the
// midpoints of 2^23 equal cells, exact in f32, from 2^-24 to 1 − 2^-24. (random_uniform's
// (word >> 8) · 2^-24 can be 0, whose log is -inf.)
DGEMMA_HOST_DEVICE inline float openUniform(uint32_t word) {
  return static_cast<float>(((word >> 9) << 1) | 1u) * (1.0f / 16777216.0f);
}

// g = −log(−log u), a standard Gumbel variate: argmax_v (z_v + g_v) is a draw from softmax(z).
DGEMMA_HOST_DEVICE inline float gumbelNoise(uint32_t word) {
  return -portableLog(-portableLog(openUniform(word)));
}

}  // namespace dgemma::canvas_sample
