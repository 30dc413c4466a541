#include <gtest/gtest.h>

#include "support/Error.h"
#include "runtime/core/HostTensor.h"

namespace dgemma {
namespace {

TEST(HostTensor, SizesAndShapeText) {
  HostTensor tensor(DType::BF16, {2, 3, 4});
  EXPECT_EQ(tensor.numElements(), 24);
  EXPECT_EQ(tensor.data.size(), 48u);
  EXPECT_EQ(shapeToString(tensor.shape), "[2,3,4]");
  EXPECT_EQ(shapeToString({}), "[]");
  EXPECT_EQ(HostTensor(DType::F32, {}).numElements(), 1);
}

TEST(HostTensor, ConvertsFloatsThroughBf16) {
  HostTensor source(DType::F32, {3});
  source.as<float>()[0] = 1.0f + 0x1p-8f;
  source.as<float>()[1] = -3.5f;
  source.as<float>()[2] = 1e30f;
  HostTensor bf16 = convertDType(source, DType::BF16, "t");
  HostTensor back = convertDType(bf16, DType::F64, "t");
  EXPECT_EQ(back.as<double>()[0], 1.0);
  EXPECT_EQ(back.as<double>()[1], -3.5);
  EXPECT_NEAR(back.as<double>()[2], 1e30, 1e28);
}

TEST(HostTensor, ConvertsIntegers) {
  HostTensor source(DType::I64, {2});
  source.as<int64_t>()[0] = 7;
  source.as<int64_t>()[1] = -3;
  HostTensor narrow = convertDType(source, DType::I32, "ids");
  EXPECT_EQ(narrow.as<int32_t>()[0], 7);
  EXPECT_EQ(narrow.as<int32_t>()[1], -3);
}

// A tensor handed over in its target dtype keeps its bytes (no copy); another dtype converts.
TEST(HostTensor, ConvertingAnRvalueToItsOwnDTypeMovesTheBytes) {
  HostTensor source(DType::F32, {1024});
  source.as<float>()[7] = 1.5f;
  const uint8_t* bytes = source.data.data();
  HostTensor same = convertDType(std::move(source), DType::F32, "t");
  EXPECT_EQ(same.data.data(), bytes);
  EXPECT_EQ(same.as<float>()[7], 1.5f);
  HostTensor wide = convertDType(std::move(same), DType::F64, "t");
  EXPECT_EQ(wide.as<double>()[7], 1.5);
}

TEST(HostTensor, RefusesFloatIntegerConversion) {
  HostTensor source(DType::F32, {1});
  try {
    convertDType(source, DType::I64, "batch.safetensors: tensor input_ids");
    FAIL() << "expected InputError";
  } catch (const InputError& error) {
    EXPECT_EQ(std::string(error.what()), "batch.safetensors: tensor input_ids: dtype f32 cannot be converted to i64");
    EXPECT_EQ(error.exitCode(), 2);
  }
}

}  // namespace
}  // namespace dgemma
