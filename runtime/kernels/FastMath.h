// exp and tanh for f32 written as straight-line arithmetic, so that loops over arrays of them
// auto-vectorise. std::exp and std::tanh are calls into libm that GCC cannot vectorise, and on the
// logit soft-cap ([B, L, V] elements) and the GELUs they were a tenth of a training step.
//
// Accuracy (FastMathTest checks it against the f64 functions over every f32 in a wide range, and
// at ±0, ±inf, NaN and the overflow and underflow edges): fastExp within 2 ulp, fastTanh within
// 2 ulp. f64 arguments take the libm functions: f64 is the reference precision of the parity tests,
// so it keeps correctly rounded-ish results rather than speed.
//
// Every branch is a bitwise select of two computed values (no early return, no ?:), which is what
// lets the compiler turn a loop over these into SIMD code.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

// Marks a function that loops over these to be compiled twice, for x86-64-v3 (AVX2 and FMA: eight
// f32 lanes, about three times the SSE2 baseline's throughput here) and for the baseline, with the
// dynamic loader picking the clone the CPU runs. Elsewhere it marks nothing. The FMA clone rounds a
// little differently (more accurately) than the baseline; both stay within the bounds above.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define DGEMMA_CPU_CLONES_FOR_AVX2 __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define DGEMMA_CPU_CLONES_FOR_AVX2
#endif

// Like DGEMMA_CPU_CLONES_FOR_AVX2, with AVX2's eight lanes but without FMA: GCC contracts a·b + c
// into an fma only where FMA is enabled, so this clone rounds every operation exactly as the
// baseline does. For loops whose results must stay bit-identical to the baseline's.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA __attribute__((target_clones("avx2", "default")))
#else
#define DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA
#endif

namespace dgemma::cpu {

namespace fastmath_detail {

inline float bitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

inline uint32_t floatToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// condition ? ifTrue : ifFalse as bit masks. Both values are computed anyway; a ?: would let the
// compiler sink one of them into a branch, and under the default -ftrapping-math it will not turn
// a branch holding a division back into a vector select.
inline float select(bool condition, float ifTrue, float ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return bitsToFloat((floatToBits(ifTrue) & mask) | (floatToBits(ifFalse) & ~mask));
}

// 2^n for n in [-126, 127], built from the exponent field.
inline float exp2Integer(int32_t n) { return bitsToFloat(static_cast<uint32_t>(n + 127) << 23); }

}  // namespace fastmath_detail

// e^x = 2^n · e^r with n = round(x / ln 2) and r = x − n ln 2, |r| ≤ ln 2 / 2. ln 2 is split in a
// high part with few significant bits (so n · high is exact) and a low correction, which keeps r
// accurate to the last bit. e^r is its Taylor series to r^7: the first omitted term is below
// 0.35^8 / 8! ≈ 5e-9, under a tenth of an f32 ulp. 2^n is applied as two factors 2^(n/2) and
// 2^(n − n/2): each stays a normal f32 for every n the clamp admits, and the last product rounds
// once into the subnormals or to infinity exactly as the true result would.
inline float fastExp(float x) {
  using namespace fastmath_detail;
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2High = 0.693145751953125f;  // 0x3F317200: 15 significant bits
  constexpr float kLn2Low = 1.42860682028622680e-6f;  // ln 2 − kLn2High
  // Beyond these e^x is 0 or inf in f32; clamping keeps n in the range exp2Integer covers.
  constexpr float kLowest = -104.0f, kHighest = 89.0f;
  // Adding 1.5 · 2^23 rounds an f32 of magnitude below 2^22 to an integer (to nearest, ties even).
  constexpr float kRoundingShift = 12582912.0f;

  const bool isNan = x != x;
  float clamped = select(x < kLowest, kLowest, x);
  clamped = select(clamped > kHighest, kHighest, clamped);
  clamped = select(isNan, 0.0f, clamped);
  const float nFloat = (clamped * kLog2e + kRoundingShift) - kRoundingShift;
  const float r = (clamped - nFloat * kLn2High) - nFloat * kLn2Low;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t n = static_cast<int32_t>(nFloat);
  const int32_t half = n / 2;
  const float result = p * exp2Integer(half) * exp2Integer(n - half);
  return select(isNan, x, result);
}

// tanh(|x|) two ways, by size:
//  * |x| < 0.625: |x| + |x|³ P(x²), P a degree-4 least-squares fit of (tanh(s) − s) / s³ on that
//    interval (relative error under 1 ulp once rounded to f32); the series form keeps tiny
//    arguments exact, where 1 − 2 / (e^2x + 1) would cancel.
//  * otherwise 1 − 2 / (e^(2|x|) + 1): the result is above 0.55, so the subtraction loses nothing,
//    and an error of fastExp moves the result by less than half its own relative size. e^(2|x|)
//    overflows to inf from |x| ≈ 44 on, which gives exactly 1, as does tanh in f32 from |x| ≈ 9.
// The sign is copied back at the end, so tanh(−0) = −0 and tanh(±inf) = ±1; NaN stays NaN.
inline float fastTanh(float x) {
  const float magnitude = std::fabs(x);
  const float square = magnitude * magnitude;
  float p = -0.005691885948181152f;
  p = p * square + 0.020626205950975418f;
  p = p * square - 0.053735293447971344f;
  p = p * square + 0.13331380486488342f;
  p = p * square - 0.3333328068256378f;
  const float small = magnitude + magnitude * square * p;
  const float large = 1.0f - 2.0f / (fastExp(2.0f * magnitude) + 1.0f);
  return std::copysign(fastmath_detail::select(magnitude < 0.625f, small, large), x);
}

// The f64 versions: the libm functions (see the file comment).
inline double fastExp(double x) { return std::exp(x); }
inline double fastTanh(double x) { return std::tanh(x); }

}  // namespace dgemma::cpu
