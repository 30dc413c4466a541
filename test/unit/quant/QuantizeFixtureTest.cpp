// dgemma's int8 and NF4 quantizers against the reference of tools/reference/make_quant_fixtures.py
// (bitsandbytes' quantize_4bit / dequantize_4bit for NF4, torch for int8), bit for bit.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "runtime/io/Safetensors.h"
#include "runtime/quant/Nf4Table.h"
#include "runtime/quant/Quantize.h"
#include "support/Error.h"

namespace dgemma::quant {
namespace {

const std::string kFixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/quant/quant.safetensors";

struct Case {
  const char* name;
  Format format;
};
constexpr Case kCases[] = {{"nf4_f32", Format::Nf4},
                           {"nf4_bf16_experts", Format::Nf4},
                           {"int8_f32", Format::Int8},
                           {"int8_bf16_experts", Format::Int8}};

void expectSameBytes(const HostTensor& actual, const HostTensor& expected, const std::string& what) {
  ASSERT_EQ(actual.dtype, expected.dtype) << what;
  ASSERT_EQ(actual.shape, expected.shape) << what;
  ASSERT_EQ(actual.data.size(), expected.data.size()) << what;
  const size_t element = dtypeSize(actual.dtype);
  for (size_t i = 0; i < actual.data.size(); i += element)
    ASSERT_EQ(std::memcmp(actual.data.data() + i, expected.data.data() + i, element), 0)
        << what << ": first difference at element " << i / element;
}

TEST(QuantizeFixture, QuantizersAndDequantizersMatchTheReferenceBitForBit) {
  const SafetensorsFile file = SafetensorsFile::open(kFixture);
  for (const Case& c : kCases) {
    SCOPED_TRACE(c.name);
    const std::string prefix = std::string(c.name) + ".";
    const HostTensor input = file.read(prefix + "input");
    const QuantizedTensor quantized = quantize(input, c.format, c.name);
    expectSameBytes(quantized.codes, file.read(prefix + "codes"), "codes");
    expectSameBytes(quantized.scales, file.read(prefix + "scales"), "scales");
    const HostTensor decoded = dequantize(quantized.codes, quantized.scales, c.format, input.shape, c.name);
    expectSameBytes(decoded, file.read(prefix + "dequant_f32"), "dequantized f32");
    expectSameBytes(convertDType(decoded, DType::BF16, c.name), file.read(prefix + "dequant_bf16"), "dequantized bf16");
  }
}

TEST(QuantizeFixture, TheFixtureExercisesNf4TiesAndEveryCode) {
  // The edge row's first block holds every midpoint exactly: without it the tie rule would go untested.
  const SafetensorsFile file = SafetensorsFile::open(kFixture);
  const HostTensor codes = file.read("nf4_f32.codes");
  bool seen[16] = {};
  for (int64_t i = 0; i < codes.numElements() * 2; ++i)
    seen[codes.as<uint8_t>()[i / 2] >> (i % 2 ? 0 : 4) & 0xF] = true;
  for (int code = 0; code < 16; ++code) EXPECT_TRUE(seen[code]) << "code " << code;
}

TEST(Quantize, Nf4TiesTakeTheLowerCodeAndInt8TiesRoundToEven) {
  float values[64] = {1.0f};
  values[1] = (kNf4Table[7] + kNf4Table[8]) / 2.0f;  // halfway between 0 and 0.0796: code 7
  uint8_t codes[32];
  float absmax;
  quantizeNf4(values, 64, codes, &absmax);
  EXPECT_EQ(absmax, 1.0f);
  EXPECT_EQ(codes[0], 0xF7);  // 1.0 is code 15 in the high nibble
  const float row[4] = {127.0f, 2.5f, -3.5f, 0.0f};
  int8_t int8Codes[4];
  float scale;
  quantizeInt8(row, 1, 4, int8Codes, &scale);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(int8Codes[1], 2);
  EXPECT_EQ(int8Codes[2], -4);
}

TEST(Quantize, ShapesFollowTheWeightAndBadShapesNameIt) {
  EXPECT_EQ(codesShape(Format::Nf4, {4, 6, 128}, "w"), (std::vector<int64_t>{4, 6, 64}));
  EXPECT_EQ(scalesShape(Format::Nf4, {4, 6, 128}, "w"), (std::vector<int64_t>{4, 6, 2}));
  EXPECT_EQ(codesShape(Format::Int8, {4, 6, 100}, "w"), (std::vector<int64_t>{4, 6, 100}));
  EXPECT_EQ(scalesShape(Format::Int8, {4, 6, 100}, "w"), (std::vector<int64_t>{4, 6}));
  try {
    codesShape(Format::Nf4, {8, 100}, "model.decoder.layers.0.mlp.up_proj.weight");
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find("model.decoder.layers.0.mlp.up_proj.weight"), std::string::npos);
    EXPECT_NE(std::string(error.what()).find("multiple of 64"), std::string::npos);
  }
}

}  // namespace
}  // namespace dgemma::quant
