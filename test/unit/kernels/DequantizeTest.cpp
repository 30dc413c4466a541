// dequantize: the CPU kernel decodes the stored reference's int8 and NF4 codes (test/fixtures/quant,
// bitsandbytes' dequantize_4bit for NF4) into exactly the reference's f32 and bf16 values.
#include <cstring>

#include "KernelTestSupport.h"
#include "runtime/io/Safetensors.h"

namespace dgemma::test {
namespace {

const std::string kFixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/quant/quant.safetensors";

template <typename T>
std::vector<T> valuesOf(const HostTensor& tensor) {
  std::vector<T> values(tensor.data.size() / sizeof(T));
  std::memcpy(values.data(), tensor.data.data(), values.size() * sizeof(T));
  return values;
}

template <typename Out>
std::vector<Out> dequantizeFixture(const SafetensorsFile& file, const std::string& name, const char* format,
                                   DType out) {
  const HostTensor codes = file.read(name + ".codes");
  const HostTensor scales = file.read(name + ".scales");
  const HostTensor input = file.read(name + ".input");
  KernelCall call("dequantize", {{"format", format}});
  if (codes.dtype == DType::U8) call.input(codes.dtype, codes.shape, valuesOf<uint8_t>(codes));
  else call.input(codes.dtype, codes.shape, valuesOf<int8_t>(codes));
  call.input(DType::F32, scales.shape, valuesOf<float>(scales)).output(out, input.shape);
  ThreadPool threads(3);
  call.run(&threads);
  return call.result<Out>();
}

TEST(DequantizeKernel, DecodesTheReferenceCodesBitForBit) {
  const SafetensorsFile file = SafetensorsFile::open(kFixture);
  for (const auto& [name, format] : {std::pair<std::string, const char*>{"nf4_f32", "nf4"},
                                     {"nf4_bf16_experts", "nf4"},
                                     {"int8_f32", "int8"},
                                     {"int8_bf16_experts", "int8"}}) {
    SCOPED_TRACE(name);
    const std::vector<float> f32 = dequantizeFixture<float>(file, name, format, DType::F32);
    const std::vector<float> expectedF32 = valuesOf<float>(file.read(name + ".dequant_f32"));
    ASSERT_EQ(f32.size(), expectedF32.size());
    EXPECT_EQ(std::memcmp(f32.data(), expectedF32.data(), f32.size() * sizeof(float)), 0);
    EXPECT_EQ(dequantizeFixture<uint16_t>(file, name, format, DType::BF16),
              valuesOf<uint16_t>(file.read(name + ".dequant_bf16")));
    const std::vector<double> f64 = dequantizeFixture<double>(file, name, format, DType::F64);
    for (size_t i = 0; i < f64.size(); ++i) ASSERT_EQ(f64[i], static_cast<double>(expectedF32[i])) << "element " << i;
  }
}

TEST(DequantizeKernel, RejectsShapesThatDoNotFitTheFormat) {
  KernelCall call("dequantize", {{"format", "nf4"}});
  call.input(DType::U8, {2, 48}, std::vector<uint8_t>(96)).input(DType::F32, {2, 1}, std::vector<float>(2));
  call.output(DType::F32, {2, 96});
  try {
    call.create();
    FAIL() << "expected an InputError";
  } catch (const InputError& error) {
    EXPECT_NE(std::string(error.what()).find(call.where()), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("multiple of 64"), std::string::npos) << error.what();
  }
  KernelCall wrongScales("dequantize", {{"format", "int8"}});
  wrongScales.input(DType::I8, {2, 4}, std::vector<int8_t>(8)).input(DType::F32, {4}, std::vector<float>(4));
  wrongScales.output(DType::F32, {2, 4});
  EXPECT_THROW(wrongScales.create(), InputError);
}

}  // namespace
}  // namespace dgemma::test
