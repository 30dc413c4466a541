// runtime/kernels/elementwise/CastMath.h, the conversions the CUDA cast runs, against the CPU's:
// support/DType.h's 16-bit conversions (every bf16 and f16 pattern; a dense sample of f32 patterns)
// and the CPU cast kernel from f64 (ties, false ties, overflow, subnormals, NaN and random patterns).
#include <cstring>
#include <limits>

#include "KernelTestSupport.h"
#include "runtime/kernels/elementwise/CastMath.h"
#include "support/DType.h"

namespace dgemma::test {
namespace {

uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

TEST(CastMathTest, SixteenBitSourcesEqualSupportDTypeOnEveryPattern) {
  for (uint32_t pattern = 0; pattern <= 0xffffu; ++pattern) {
    const uint16_t half = static_cast<uint16_t>(pattern);
    ASSERT_EQ(bitsOf(cast::bf16BitsToF32(half)), bitsOf(bf16BitsToF32(half))) << std::hex << pattern;
    ASSERT_EQ(bitsOf(cast::f16BitsToF32(half)), bitsOf(f16BitsToF32(half))) << std::hex << pattern;
  }
}

TEST(CastMathTest, F32ToSixteenBitsEqualsSupportDType) {
  // Every 251st pattern (all exponents, both signs, NaNs) and the patterns around each rounding
  // boundary of the low 13 bits.
  for (uint64_t pattern = 0; pattern <= 0xffffffffull; pattern += 251) {
    for (uint32_t nudge : {0u, 0xfffu, 0x1000u, 0x1001u, 0x7fffu, 0x8000u, 0x8001u}) {
      const uint32_t bits = (static_cast<uint32_t>(pattern) & ~0x1fffu) | (nudge & 0x1fffu);
      const uint32_t bits16 = (static_cast<uint32_t>(pattern) & ~0xffffu) | nudge;
      float value, value16;
      std::memcpy(&value, &bits, sizeof value);
      std::memcpy(&value16, &bits16, sizeof value16);
      ASSERT_EQ(cast::f32ToF16Bits(value), f32ToF16Bits(value)) << std::hex << bits;
      ASSERT_EQ(cast::f32ToBf16Bits(value16), f32ToBf16Bits(value16)) << std::hex << bits16;
    }
  }
}

TEST(CastMathTest, F64ToSixteenBitsEqualsTheCpuCastKernel) {
  std::vector<double> values = {0.0, -0.0, 1.0, 1.0 + 0x1p-8, 1.0 + 0x1p-8 + 0x1p-40, 1.0 + 0x1p-11 + 0x1p-40,
                                1.0 + 0x1p-11, -(1.0 + 3 * 0x1p-9), 65504.0, 65519.99, 65520.0, 1e300, -1e300,
                                3.4028235677973366e38, 3.4028236e38, 1e-300, 0x1p-24, 0x1p-25, 0x1p-25 + 0x1p-60,
                                0x1p-133, 0x1p-134 + 0x1p-170, std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                                std::numeric_limits<double>::denorm_min()};
  std::mt19937_64 generator(61);
  for (int i = 0; i < 20000; ++i) {
    uint64_t bits = generator();
    // Mostly exponents near f32's and f16's ranges, so the rounding paths are exercised.
    bits = (bits & 0x800fffffffffffffull) | ((uint64_t{1023 - 30 + generator() % 60}) << 52);
    double value;
    std::memcpy(&value, &bits, sizeof value);
    values.push_back(value);
  }
  for (DType to : {DType::BF16, DType::F16}) {
    KernelCall call("cast");
    const int64_t count = static_cast<int64_t>(values.size());
    call.input(DType::F64, {count}, values).output(to, {count});
    call.run();
    const std::vector<uint16_t> cpu = call.result<uint16_t>();
    for (size_t i = 0; i < values.size(); ++i)
      ASSERT_EQ(cpu[i], to == DType::BF16 ? cast::f64ToBf16Bits(values[i]) : cast::f64ToF16Bits(values[i]))
          << dtypeName(to) << " of " << values[i];
  }
}

}  // namespace
}  // namespace dgemma::test
