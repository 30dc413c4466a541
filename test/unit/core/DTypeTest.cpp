#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "support/DType.h"

namespace dgemma {
namespace {

float fromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

TEST(DType, NamesRoundTrip) {
  for (DType dtype : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::I8, DType::U8, DType::Bool})
    EXPECT_EQ(parseDType(dtypeName(dtype)), dtype);
  EXPECT_FALSE(parseDType("float32").has_value());
  EXPECT_EQ(dtypeSize(DType::BF16), 2u);
  EXPECT_EQ(dtypeSize(DType::I64), 8u);
  EXPECT_TRUE(isFloating(DType::F16));
  EXPECT_FALSE(isFloating(DType::I32));
}

TEST(DType, Bf16RoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(f32ToBf16Bits(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3 * 2^-8 lies between 1 + 2^-7 (odd) and 1 + 2^-6 (even): rounds up to the even one.
  EXPECT_EQ(f32ToBf16Bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  // Just above the tie rounds up.
  EXPECT_EQ(f32ToBf16Bits(fromBits(0x3f808001)), 0x3f81);
  EXPECT_EQ(bf16BitsToF32(0x3f81), 1.0f + 0x1p-7f);
  // Overflow to infinity, infinities and NaN preserved.
  EXPECT_EQ(f32ToBf16Bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(f32ToBf16Bits(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(bf16BitsToF32(f32ToBf16Bits(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(DType, F16RoundTripAndRounding) {
  EXPECT_EQ(f32ToF16Bits(1.0f), 0x3c00);
  EXPECT_EQ(f32ToF16Bits(-2.0f), 0xc000);
  EXPECT_EQ(f32ToF16Bits(65504.0f), 0x7bff);   // largest finite
  EXPECT_EQ(f32ToF16Bits(65520.0f), 0x7c00);   // rounds to infinity
  EXPECT_EQ(f32ToF16Bits(0x1p-24f), 0x0001);   // smallest subnormal
  EXPECT_EQ(f32ToF16Bits(0x1p-25f), 0x0000);   // tie with zero goes to even (zero)
  EXPECT_EQ(f32ToF16Bits(1.0f + 0x1p-11f), 0x3c00);      // tie, even stays
  EXPECT_EQ(f32ToF16Bits(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, rounds to even
  for (uint32_t bits = 0; bits < 0x7c00; bits += 37) EXPECT_EQ(f32ToF16Bits(f16BitsToF32(bits)), bits) << bits;
  EXPECT_TRUE(std::isnan(f16BitsToF32(0x7e00)));
}

}  // namespace
}  // namespace dgemma
