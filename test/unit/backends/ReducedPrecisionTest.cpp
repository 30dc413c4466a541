// bf16 and f16 steps on the CPU backend (runtime/backends/cpu/ReducedPrecision.h): each runs the f32
// kernel on the widened values and rounds its 16-bit results once; bit-moving kernels stay as they
// are; steps without a 16-bit float are untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "runtime/kernel_api/Backend.h"
#include "support/DType.h"

namespace dgemma {
namespace {

// One step's buffers with host storage, run through a named kernel of a registry.
class Step16 {
 public:
  Step16(std::string op, nlohmann::json attrs = nlohmann::json::object()) {
    step_.op = std::move(op);
    step_.attrs = std::move(attrs);
  }
  Step16& input(DType dtype, std::vector<int64_t> shape, const std::vector<float>& values) {
    add(inputs_, dtype, std::move(shape));
    store(inputs_.back(), values);
    return *this;
  }
  Step16& output(DType dtype, std::vector<int64_t> shape) {
    add(outputs_, dtype, std::move(shape));
    return *this;
  }
  // The outputs as floats (16-bit and f32 buffers widened, bool as 0/1).
  std::vector<std::vector<float>> run(const KernelRegistry& registry) {
    KernelSignature signature;
    signature.step = &step_;
    signature.where = "step 0 (" + step_.op + ")";
    std::vector<TensorRef> inputs, outputs;
    for (Tensor& tensor : inputs_) {
      signature.inputs.push_back(&tensor.buffer);
      inputs.push_back(TensorRef{tensor.bytes.data(), &tensor.buffer});
    }
    for (Tensor& tensor : outputs_) {
      std::fill(tensor.bytes.begin(), tensor.bytes.end(), uint8_t{0xCD});
      signature.outputs.push_back(&tensor.buffer);
      outputs.push_back(TensorRef{tensor.bytes.data(), &tensor.buffer});
    }
    ExecContext context;
    (*registry.find(step_.op))(signature)->run(context, inputs, outputs);
    std::vector<std::vector<float>> results;
    for (const Tensor& tensor : outputs_) results.push_back(load(tensor));
    return results;
  }

 private:
  struct Tensor {
    Buffer buffer;
    std::vector<uint8_t> bytes;
  };
  static void add(std::vector<Tensor>& tensors, DType dtype, std::vector<int64_t> shape) {
    Tensor tensor;
    tensor.buffer.dtype = dtype;
    tensor.buffer.shape = std::move(shape);
    tensor.bytes.resize(tensor.buffer.bytes());
    tensors.push_back(std::move(tensor));
  }
  static void store(Tensor& tensor, const std::vector<float>& values) {
    ASSERT_EQ(static_cast<int64_t>(values.size()), tensor.buffer.numElements());
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits = 0;
      switch (tensor.buffer.dtype) {
        case DType::F32: std::memcpy(tensor.bytes.data() + 4 * i, &values[i], 4); continue;
        case DType::I64: {  // small integers, exact in a float
          const int64_t index = static_cast<int64_t>(values[i]);
          std::memcpy(tensor.bytes.data() + 8 * i, &index, 8);
          continue;
        }
        case DType::BF16: bits = f32ToBf16Bits(values[i]); break;
        case DType::F16: bits = f32ToF16Bits(values[i]); break;
        default: FAIL() << "test bug: unsupported input dtype";
      }
      std::memcpy(tensor.bytes.data() + 2 * i, &bits, 2);
    }
  }
  static std::vector<float> load(const Tensor& tensor) {
    std::vector<float> values(static_cast<size_t>(tensor.buffer.numElements()));
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t bits = 0;
      switch (tensor.buffer.dtype) {
        case DType::F32: std::memcpy(&values[i], tensor.bytes.data() + 4 * i, 4); break;
        case DType::Bool: values[i] = tensor.bytes[i]; break;
        case DType::BF16: std::memcpy(&bits, tensor.bytes.data() + 2 * i, 2); values[i] = bf16BitsToF32(bits); break;
        case DType::F16: std::memcpy(&bits, tensor.bytes.data() + 2 * i, 2); values[i] = f16BitsToF32(bits); break;
        default: ADD_FAILURE() << "test bug: unsupported output dtype";
      }
    }
    return values;
  }

  dgemma::Step step_;
  std::vector<Tensor> inputs_, outputs_;
};

std::vector<float> randomValues(size_t count, uint32_t seed) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<float> distribution(-2.0f, 2.0f);
  std::vector<float> values(count);
  for (float& value : values) value = distribution(generator);
  return values;
}

std::vector<float> roundedTo(DType dtype, std::vector<float> values) {
  for (float& value : values)
    value = dtype == DType::BF16 ? bf16BitsToF32(f32ToBf16Bits(value)) : f16BitsToF32(f32ToF16Bits(value));
  return values;
}

class ReducedPrecisionTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  const KernelRegistry& kernels = backend->kernels();
};

// [6, 40] x [40, 5] of values representable in `dtype`, as `operands` x `operands` -> `result`.
std::vector<float> matmul(const KernelRegistry& kernels, DType dtype, DType operands, DType result) {
  const std::vector<float> a = roundedTo(dtype, randomValues(6 * 40, 1)), b = roundedTo(dtype, randomValues(40 * 5, 2));
  return Step16("matmul", {{"transpose_a", false}, {"transpose_b", false}})
      .input(operands, {6, 40}, a)
      .input(operands, {40, 5}, b)
      .output(result, {6, 5})
      .run(kernels)[0];
}

// A matmul on 16-bit tensors is the f32 matmul of the same (representable) values, rounded once.
TEST_P(ReducedPrecisionTest, MatmulRoundsTheF32ResultOnce) {
  const DType dtype = GetParam();
  const std::vector<float> wide = matmul(kernels, dtype, DType::F32, DType::F32);
  const std::vector<float> narrow = matmul(kernels, dtype, dtype, dtype);
  EXPECT_EQ(narrow, roundedTo(dtype, wide));
  // Rounding happened: 40-term sums of 8- or 11-bit values need more bits than the result keeps.
  EXPECT_NE(narrow, wide);
}

// A step with an f32 buffer among 16-bit ones (a widening GEMM, the routing weights of the MoE
// combine) widens only the 16-bit ones: here the f32 output keeps the f32 result unrounded.
TEST_P(ReducedPrecisionTest, MixedStepsWidenOnlyTheirSixteenBitBuffers) {
  const DType dtype = GetParam();
  EXPECT_EQ(matmul(kernels, dtype, dtype, DType::F32), matmul(kernels, dtype, DType::F32, DType::F32));
}

// RMSNorm computes in f32 inside the op (docs/training.md, "Mixed precision") and rounds its output; a comparison's
// bool result needs no rounding.
TEST_P(ReducedPrecisionTest, NormAndCompareComputeOnWidenedValues) {
  const DType dtype = GetParam();
  const std::vector<float> x = roundedTo(dtype, randomValues(4 * 8, 3)), weight = roundedTo(dtype, randomValues(8, 4));
  const nlohmann::json attrs = {{"eps", 1e-6}};
  const std::vector<float> wide =
      Step16("rms_norm", attrs).input(DType::F32, {4, 8}, x).input(DType::F32, {8}, weight).output(DType::F32, {4, 8}).run(kernels)[0];
  const std::vector<float> narrow =
      Step16("rms_norm", attrs).input(dtype, {4, 8}, x).input(dtype, {8}, weight).output(dtype, {4, 8}).run(kernels)[0];
  EXPECT_EQ(narrow, roundedTo(dtype, wide));

  const std::vector<float> keys = roundedTo(dtype, randomValues(10, 5));
  const std::vector<float> threshold(10, 0.25f);
  std::vector<float> expected(10);
  for (size_t i = 0; i < keys.size(); ++i) expected[i] = keys[i] < 0.25f ? 1.0f : 0.0f;
  EXPECT_EQ(Step16("compare", {{"predicate", "lt"}})
                .input(dtype, {10}, keys)
                .input(dtype, {10}, threshold)
                .output(DType::Bool, {10})
                .run(kernels)[0],
            expected);
}

// moe_experts with its optional second output gate_up_rows, and moe_experts_backward with its optional
// input 6, as a 16-bit plan has them: the rows in f32 (the precision the experts compute in,
// docs/training.md, "Expert activations"). The wrapper widens the 16-bit buffers and rounds each
// 16-bit output once; the f32 rows pass unrounded, so the backward that reads them gives the same
// bytes as the one that computes them again.
TEST_P(ReducedPrecisionTest, MoeExpertsKeepF32GateUpRowsBesideSixteenBitFloats) {
  const DType dtype = GetParam();
  const int64_t tokens = 5, hidden = 8, topK = 2, experts = 3, inner = 4;
  const std::vector<float> x = roundedTo(dtype, randomValues(tokens * hidden, 7));
  const std::vector<float> weights = roundedTo(dtype, randomValues(tokens * topK, 8));
  const std::vector<float> indices = {0, 2, 1, 1, 2, 0, 0, 1, 2, 2};
  const std::vector<float> gateUp = roundedTo(dtype, randomValues(experts * 2 * inner * hidden, 9));
  const std::vector<float> down = roundedTo(dtype, randomValues(experts * hidden * inner, 10));
  const std::vector<float> dy = roundedTo(dtype, randomValues(tokens * hidden, 11));
  auto inputs = [&](Step16 step, DType floats) {
    step.input(floats, {tokens, hidden}, x).input(floats, {tokens, topK}, weights);
    step.input(DType::I64, {tokens, topK}, indices);
    step.input(floats, {experts, 2 * inner, hidden}, gateUp).input(floats, {experts, hidden, inner}, down);
    return step;
  };
  auto forward = [&](DType floats) {
    return inputs(Step16("moe_experts", {{"expert_offset", 0}}), floats)
        .output(floats, {tokens, hidden})
        .output(DType::F32, {tokens * topK, 2 * inner})
        .run(kernels);
  };
  const std::vector<std::vector<float>> wide = forward(DType::F32), narrow = forward(dtype);
  EXPECT_EQ(narrow[0], roundedTo(dtype, wide[0]));
  EXPECT_EQ(narrow[1], wide[1]);

  auto backward = [&](DType floats, const std::vector<float>* rows) {
    Step16 step = inputs(Step16("moe_experts_backward", {{"expert_offset", 0}}), floats);
    step.input(floats, {tokens, hidden}, dy);
    if (rows) step.input(DType::F32, {tokens * topK, 2 * inner}, *rows);
    step.output(floats, {tokens, hidden}).output(floats, {tokens, topK});
    step.output(floats, {experts, 2 * inner, hidden}).output(floats, {experts, hidden, inner});
    return step.run(kernels);
  };
  const std::vector<std::vector<float>> wideGradients = backward(DType::F32, &narrow[1]);
  const std::vector<std::vector<float>> reading = backward(dtype, &narrow[1]), recomputing = backward(dtype, nullptr);
  for (size_t output = 0; output < 4; ++output) {
    EXPECT_EQ(reading[output], roundedTo(dtype, wideGradients[output])) << "output " << output;
    EXPECT_EQ(reading[output], recomputing[output]) << "output " << output;
  }
}

// Bit-moving kernels take 16-bit buffers directly: a transpose moves the exact bits.
TEST_P(ReducedPrecisionTest, LayoutKernelsMoveBitsUnchanged) {
  const DType dtype = GetParam();
  const std::vector<float> x = roundedTo(dtype, randomValues(3 * 4, 6));
  const std::vector<float> y =
      Step16("transpose", {{"perm", {1, 0}}}).input(dtype, {3, 4}, x).output(dtype, {4, 3}).run(kernels)[0];
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j < 4; ++j) EXPECT_EQ(y[j * 3 + i], x[i * 4 + j]);
}

INSTANTIATE_TEST_SUITE_P(SixteenBitFloats, ReducedPrecisionTest, ::testing::Values(DType::BF16, DType::F16),
                         [](const ::testing::TestParamInfo<DType>& info) { return std::string(dtypeName(info.param)); });

}  // namespace
}  // namespace dgemma
