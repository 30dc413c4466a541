// cast: round-to-nearest-even into bf16 and f16, exact widening, integer conversions.
#include <cmath>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

template <typename From, typename To>
std::vector<To> castValues(DType from, DType to, const std::vector<From>& values) {
  KernelCall call("cast");
  call.input(from, {static_cast<int64_t>(values.size())}, values).output(to, {static_cast<int64_t>(values.size())});
  call.run();
  return call.result<To>();
}

TEST(CastKernel, F32ToBf16RoundsToNearestEven) {
  const float step = std::ldexp(1.0f, -8);  // half a bf16 ulp at 1.0
  const std::vector<float> values = {
      1.0f + step,          // tie between 1 (even) and 1 + 2^-7: down to 0x3f80
      1.0f + 3 * step,      // tie between 1 + 2^-7 (odd) and 1 + 2^-6: up to 0x3f82
      1.0f + 1.5f * step,   // above the tie: up to 0x3f81
      1.0f + 0.5f * step,   // below the tie: down to 0x3f80
      -(1.0f + 3 * step),   // the sign does not change the rounding
      INFINITY,
  };
  EXPECT_EQ((castValues<float, uint16_t>(DType::F32, DType::BF16, values)),
            (std::vector<uint16_t>{0x3f80, 0x3f82, 0x3f81, 0x3f80, 0xbf82, 0x7f80}));
}

TEST(CastKernel, F32ToF16RoundsToNearestEvenAndSaturatesToInfinity) {
  const float step = std::ldexp(1.0f, -11);  // half an f16 ulp at 1.0
  const std::vector<float> values = {1.0f + step, 1.0f + 3 * step, 65504.0f, 65520.0f, std::ldexp(1.0f, -24)};
  // 65520 is the tie between the largest f16 (65504) and 2^16, which rounds to infinity; 2^-24 is
  // the smallest f16 subnormal.
  EXPECT_EQ((castValues<float, uint16_t>(DType::F32, DType::F16, values)),
            (std::vector<uint16_t>{0x3c00, 0x3c02, 0x7bff, 0x7c00, 0x0001}));
}

TEST(CastKernel, F64ToBf16RoundsOnceNotTwice) {
  // 1 + 2^-8 + 2^-40 lies just above a bf16 tie. Rounding to f32 first would land exactly on the tie
  // and then round down to 1.0; the correctly rounded bf16 is 1 + 2^-7.
  const std::vector<double> values = {1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40), 1.0 + std::ldexp(1.0, -8)};
  EXPECT_EQ((castValues<double, uint16_t>(DType::F64, DType::BF16, values)), (std::vector<uint16_t>{0x3f81, 0x3f80}));
  const std::vector<double> halfValues = {1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40)};
  EXPECT_EQ((castValues<double, uint16_t>(DType::F64, DType::F16, halfValues)), (std::vector<uint16_t>{0x3c01}));
}

TEST(CastKernel, NarrowFloatsWidenExactly) {
  EXPECT_EQ((castValues<uint16_t, float>(DType::BF16, DType::F32, {0x3f81, 0xc040})),
            (std::vector<float>{1.0f + 1.0f / 128, -3.0f}));
  EXPECT_EQ((castValues<uint16_t, double>(DType::F16, DType::F64, {0x3c01, 0x0001})),
            (std::vector<double>{1.0 + 1.0 / 1024, std::ldexp(1.0, -24)}));
  EXPECT_EQ((castValues<float, double>(DType::F32, DType::F64, {0.1f})),
            (std::vector<double>{static_cast<double>(0.1f)}));
}

TEST(CastKernel, IntegerConversions) {
  EXPECT_EQ((castValues<int64_t, int32_t>(DType::I64, DType::I32, {7, -2, (int64_t{1} << 32) + 5})),
            (std::vector<int32_t>{7, -2, 5}));  // narrowing wraps modulo 2^32
  EXPECT_EQ((castValues<int32_t, uint8_t>(DType::I32, DType::Bool, {0, 3, -1})), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ((castValues<int32_t, float>(DType::I32, DType::F32, {16777217, -5})),
            (std::vector<float>{16777216.0f, -5.0f}));  // 2^24 + 1 rounds to even
  EXPECT_EQ((castValues<int64_t, uint16_t>(DType::I64, DType::BF16, {257, 259})),
            (std::vector<uint16_t>{0x4380, 0x4382}));  // 256 + 1 and 256 + 3 are bf16 ties
}

TEST(CastKernel, LargeCastAcrossThreads) {
  ThreadPool threads(2);
  const std::vector<float> values = randomValues<float>(50000, 9, -100, 100);
  KernelCall call("cast");
  call.input(DType::F32, {50000}, values).output(DType::BF16, {50000});
  call.run(&threads);
  const std::vector<uint16_t> bits = call.result<uint16_t>();
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(bits[i], f32ToBf16Bits(values[i])) << "at " << i;
}

}  // namespace
}  // namespace dgemma::test
