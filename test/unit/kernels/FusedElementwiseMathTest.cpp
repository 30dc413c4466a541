// runtime/kernels/fused_elementwise/FusedElementwiseMath.h, the CUDA kernel's per-element
// interpreter, run on the host over every output element against the CPU fused_elementwise kernel
// on the same inputs: broadcasting (a scalar, a row, a column), bf16 values rounded between
// instructions and by the store, casts, select on a bool condition, and NaN and infinities. Programs
// of IEEE operations only must agree bit for bit; with exp, tanh or gelu_tanh (libm's expf and
// tanhf on the host, the CPU kernel's fastExp and fastTanh) within 4e-6 of max(1, |cpu|) in f32 and
// one bf16 ulp in bf16.
#include "KernelTestSupport.h"
#include "runtime/kernels/fused_elementwise/FusedElementwiseMath.h"
#include "support/Shape.h"

namespace dgemma::test {
namespace {

struct Operand {
  DType dtype;
  std::vector<int64_t> shape;
};

struct ProgramCase {
  std::string program;
  std::vector<Operand> inputs;
  DType output;
  std::vector<int64_t> shape;
  bool exact;  // IEEE operations only
};

// Random values with some specials, as the element type of `dtype` (bool: 0 or 1 bytes).
std::vector<uint8_t> inputBytes(const Operand& operand, uint32_t seed) {
  const int64_t count = numElementsOf(operand.shape);
  std::vector<uint8_t> bytes(static_cast<size_t>(count * dtypeSize(operand.dtype)));
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, 80.0f, -90.0f};
  for (int64_t i = 0; i < count; ++i) {
    const float value = generator() % 29 == 0 ? specials[generator() % 8] : uniform(generator);
    if (operand.dtype == DType::F32) std::memcpy(bytes.data() + 4 * i, &value, 4);
    else if (operand.dtype == DType::BF16) {
      const uint16_t bits = f32ToBf16Bits(value);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    } else bytes[i] = value > 0 ? 1 : 0;
  }
  return bytes;
}

// KernelCall takes a buffer's elements in a type of the dtype's size.
void addInput(KernelCall& call, const Operand& operand, const std::vector<uint8_t>& bytes) {
  auto typed = [&](auto element) {
    std::vector<decltype(element)> values(bytes.size() / sizeof(element));
    std::memcpy(values.data(), bytes.data(), bytes.size());
    call.input(operand.dtype, operand.shape, values);
  };
  if (operand.dtype == DType::F32) typed(float{});
  else if (operand.dtype == DType::BF16) typed(uint16_t{});
  else typed(uint8_t{});
}

float elementOf(const std::vector<uint8_t>& bytes, DType dtype, int64_t i) {
  if (dtype == DType::BF16) {
    uint16_t bits;
    std::memcpy(&bits, bytes.data() + 2 * i, 2);
    return bf16BitsToF32(bits);
  }
  float value;
  std::memcpy(&value, bytes.data() + 4 * i, 4);
  return value;
}

void expectInterpreterMatchesCpu(const ProgramCase& c, uint32_t seed) {
  KernelCall call("fused_elementwise", {{"program", c.program}});
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<std::vector<int64_t>> shapes;
  for (const Operand& operand : c.inputs) {
    inputs.push_back(inputBytes(operand, seed++));
    shapes.push_back(operand.shape);
    addInput(call, operand, inputs.back());
  }
  call.output(c.output, c.shape);
  call.run();
  const std::vector<uint8_t> cpu = call.result<uint8_t>(0);

  std::string error;
  const std::optional<fused::Program> program = fused::parseProgram(c.program, static_cast<int64_t>(c.inputs.size()), error);
  ASSERT_TRUE(program) << error;
  std::vector<DType> valueDTypes;
  for (const Operand& operand : c.inputs) valueDTypes.push_back(operand.dtype);
  for (const fused::Instruction& instruction : program->instructions) valueDTypes.push_back(*parseDType(instruction.dtype));
  std::vector<std::vector<int64_t>> strides;
  const std::vector<int64_t> dims = fused_math::mergedLayout(c.shape, shapes, strides);
  ASSERT_EQ(fused_math::fusedProgramLimits(shapes.size(), program->instructions.size(), dims.size()), "");
  const fused_math::FusedProgram encoded = fused_math::encodeProgram(*program, valueDTypes, c.shape, shapes);
  std::vector<const void*> pointers;
  for (const std::vector<uint8_t>& input : inputs) pointers.push_back(input.data());
  std::vector<uint8_t> host(cpu.size(), 0xCD);
  for (int64_t i = 0; i < encoded.count; ++i) fused_math::evaluateElement(encoded, pointers.data(), host.data(), i);

  const int64_t count = numElementsOf(c.shape);
  for (int64_t i = 0; i < count; ++i) {
    const float expected = elementOf(cpu, c.output, i), actual = elementOf(host, c.output, i);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(actual)) << c.program << " at " << i;
      continue;
    }
    if (c.exact || std::isinf(expected)) {
      ASSERT_EQ(std::memcmp(cpu.data() + i * dtypeSize(c.output), host.data() + i * dtypeSize(c.output),
                            dtypeSize(c.output)),
                0)
          << c.program << " at " << i << ": cpu " << expected << ", interpreter " << actual;
      continue;
    }
    const double scale = std::max(1.0f, std::fabs(expected));
    const double tolerance = c.output == DType::BF16 ? (4e-6 + std::ldexp(1.0, -7)) * scale : 4e-6 * scale;
    ASSERT_NEAR(actual, expected, tolerance) << c.program << " at " << i;
  }
}

TEST(FusedElementwiseMath, InterpreterMatchesCpuKernel) {
  const DType f32 = DType::F32, bf16 = DType::BF16;
  const std::vector<ProgramCase> cases = {
      // A bias add, a residual and a scale with broadcasting (IEEE only).
      {"add f32 0 1; mul f32 2 3; sub f32 4 0", {{f32, {3, 5, 7}}, {f32, {7}}, {f32, {}}}, f32, {3, 5, 7}, true},
      // Column broadcast and NaN-winning clamps.
      {"maximum f32 0 1; minimum f32 2 1; div f32 3 0", {{f32, {4, 9}}, {f32, {4, 1}}}, f32, {4, 9}, true},
      // bf16 values rounded between instructions, a cast to f32 and back, a bf16 store.
      {"mul bf16 0 1; add bf16 2 0; cast f32 3; sqrt f32 4; cast bf16 5",
       {{bf16, {6, 11}}, {bf16, {11}}}, bf16, {6, 11}, true},
      // select on a bool condition.
      {"neg f32 1; select f32 0 1 2", {{DType::Bool, {5, 1}}, {f32, {5, 8}}}, f32, {5, 8}, true},
      // The logit soft-cap.
      {"div f32 0 1; tanh f32 2; mul f32 3 1", {{f32, {4, 33}}, {f32, {}}}, f32, {4, 33}, false},
      // GELU ⊙ up in bf16 and an exp / log chain.
      {"gelu_tanh bf16 0; mul bf16 2 1", {{bf16, {7, 16}}, {bf16, {7, 16}}}, bf16, {7, 16}, false},
      {"exp f32 0; log f32 1; add f32 2 0", {{f32, {50}}}, f32, {50}, false},
  };
  uint32_t seed = 700;
  for (const ProgramCase& c : cases) {
    SCOPED_TRACE(c.program);
    expectInterpreterMatchesCpu(c, seed);
    seed += 10;
  }
}

TEST(FusedElementwiseMath, LayoutMergesAndDropsDimensions) {
  std::vector<std::vector<int64_t>> strides;
  // [2, 1, 3, 4] with a full input and a [4] row: the size-1 dim drops, 2 and 3 merge for both.
  const std::vector<int64_t> dims = fused_math::mergedLayout({2, 1, 3, 4}, {{2, 1, 3, 4}, {4}}, strides);
  EXPECT_EQ(dims, (std::vector<int64_t>{6, 4}));
  EXPECT_EQ(strides[0], (std::vector<int64_t>{4, 1}));
  EXPECT_EQ(strides[1], (std::vector<int64_t>{0, 1}));
  EXPECT_NE(fused_math::fusedProgramLimits(9, 1, 1), "");
  EXPECT_NE(fused_math::fusedProgramLimits(1, 33, 1), "");
  EXPECT_NE(fused_math::fusedProgramLimits(1, 1, 7), "");
}

}  // namespace
}  // namespace dgemma::test
