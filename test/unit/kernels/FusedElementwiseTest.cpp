// fused_elementwise against the chain of single-op kernels it replaces, bit for bit: each program is
// run once fused and once op by op (every intermediate a buffer of its dtype), both through the CPU
// backend's registry, whose 16-bit widening (backends/cpu/ReducedPrecision.h) is what the unfused
// bf16 and f16 steps run under.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <random>

#include "plan/FusedElementwiseProgram.h"
#include "runtime/backends/cpu/ReducedPrecision.h"
#include "runtime/core/ThreadPool.h"
#include "runtime/kernels/CpuKernels.h"
#include "support/Error.h"

namespace dgemma::test {
namespace {

const KernelRegistry& backendKernels() {
  static const KernelRegistry registry = [] {
    KernelRegistry f32Kernels;
    registerCpuKernels(f32Kernels);
    return withReducedPrecisionFloats(f32Kernels);
  }();
  return registry;
}

struct Tensor {
  Buffer buffer;
  std::vector<uint8_t> bytes;
};

class Graph {
 public:
  Tensor& tensor(DType dtype, std::vector<int64_t> shape) {
    Tensor& tensor = tensors_.emplace_back();
    tensor.buffer.dtype = dtype;
    tensor.buffer.shape = std::move(shape);
    tensor.bytes.assign(tensor.buffer.bytes(), uint8_t{0xCD});
    return tensor;
  }

  // Random finite values of the dtype in [-4, 4], with some zeros, signed zeros, infinities and NaNs.
  Tensor& input(DType dtype, std::vector<int64_t> shape, uint32_t seed) {
    Tensor& result = tensor(dtype, std::move(shape));
    std::mt19937 generator(seed);
    std::uniform_real_distribution<double> uniform(-4.0, 4.0);
    const double specials[] = {0.0, -0.0, std::numeric_limits<double>::infinity(),
                               -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN(),
                               1e-30, 80.0, -90.0};
    const int64_t count = result.buffer.numElements();
    for (int64_t i = 0; i < count; ++i) {
      const double value = generator() % 41 == 0 ? specials[generator() % 8] : uniform(generator);
      uint8_t* at = result.bytes.data() + i * dtypeSize(dtype);
      switch (dtype) {
        case DType::F32: { const float v = static_cast<float>(value); std::memcpy(at, &v, 4); break; }
        case DType::F64: std::memcpy(at, &value, 8); break;
        case DType::BF16: { const uint16_t v = f32ToBf16Bits(static_cast<float>(value)); std::memcpy(at, &v, 2); break; }
        case DType::F16: { const uint16_t v = f32ToF16Bits(static_cast<float>(value)); std::memcpy(at, &v, 2); break; }
        default: *at = value > 0 ? 1 : 0; break;  // bool
      }
    }
    return result;
  }

  void run(const std::string& op, nlohmann::json attrs, const std::vector<Tensor*>& inputs, Tensor& output,
           ThreadPool* threads) {
    Step step;
    step.op = op;
    step.attrs = std::move(attrs);
    KernelSignature signature;
    signature.step = &step;
    signature.where = "step 0 (" + op + ")";
    std::vector<TensorRef> inputRefs, outputRefs{TensorRef{output.bytes.data(), &output.buffer}};
    for (Tensor* input : inputs) {
      signature.inputs.push_back(&input->buffer);
      inputRefs.push_back(TensorRef{input->bytes.data(), &input->buffer});
    }
    signature.outputs.push_back(&output.buffer);
    const KernelFactory* factory = backendKernels().find(op);
    ASSERT_NE(factory, nullptr) << op;
    std::unique_ptr<Kernel> kernel = (*factory)(signature);
    ExecContext context;
    context.threads = threads;
    kernel->run(context, inputRefs, outputRefs);
  }

 private:
  std::deque<Tensor> tensors_;  // stable addresses
};

std::vector<int64_t> broadcast(const std::vector<const std::vector<int64_t>*>& shapes) {
  std::vector<int64_t> result;
  for (const std::vector<int64_t>* shape : shapes) {
    const size_t rank = std::max(result.size(), shape->size());
    std::vector<int64_t> merged(rank, 1);
    for (size_t d = 0; d < rank; ++d) {
      const int64_t a = d + result.size() >= rank ? result[d + result.size() - rank] : 1;
      const int64_t b = d + shape->size() >= rank ? (*shape)[d + shape->size() - rank] : 1;
      merged[d] = a == 1 ? b : a;
    }
    result = std::move(merged);
  }
  return result;
}

// Runs `program` fused and op by op on `inputs`; expects the same bytes.
void expectFusedEqualsUnfused(Graph& graph, const std::string& text, const std::vector<Tensor*>& inputs,
                              ThreadPool* threads = nullptr) {
  std::string error;
  const auto program = fused::parseProgram(text, static_cast<int64_t>(inputs.size()), error);
  ASSERT_TRUE(program) << error;
  std::vector<Tensor*> values = inputs;
  for (const fused::Instruction& instruction : program->instructions) {
    std::vector<Tensor*> args;
    std::vector<const std::vector<int64_t>*> shapes;
    for (int64_t arg : instruction.args) {
      args.push_back(values[arg]);
      shapes.push_back(&values[arg]->buffer.shape);
    }
    Tensor& out = graph.tensor(*parseDType(instruction.dtype), broadcast(shapes));
    graph.run(fused::infoOf(instruction.opcode).name, nlohmann::json::object(), args, out, threads);
    values.push_back(&out);
  }
  const Tensor& unfused = *values.back();
  Tensor& fusedResult = graph.tensor(unfused.buffer.dtype, unfused.buffer.shape);
  graph.run("fused_elementwise", {{"program", text}}, inputs, fusedResult, threads);
  ASSERT_EQ(fusedResult.bytes.size(), unfused.bytes.size());
  const size_t size = dtypeSize(unfused.buffer.dtype);
  for (size_t i = 0; i < unfused.bytes.size(); i += size)
    ASSERT_EQ(std::memcmp(fusedResult.bytes.data() + i, unfused.bytes.data() + i, size), 0)
        << text << ": element " << i / size << " differs";
}

TEST(FusedElementwise, BiasGeluEqualsUnfusedF32) {
  Graph graph;
  expectFusedEqualsUnfused(graph, "add f32 0 1; gelu_tanh f32 2",
                           {&graph.input(DType::F32, {3, 5, 67}, 1), &graph.input(DType::F32, {67}, 2)});
}

TEST(FusedElementwise, SoftCapEqualsUnfusedF32) {
  Graph graph;
  expectFusedEqualsUnfused(graph, "div f32 0 1; tanh f32 2; mul f32 3 1",
                           {&graph.input(DType::F32, {4, 300}, 3), &graph.input(DType::F32, {1}, 4)});
}

TEST(FusedElementwise, ScaledResidualEqualsUnfusedF32) {
  Graph graph;
  expectFusedEqualsUnfused(graph, "mul f32 0 1; add f32 2 3; sub f32 4 0",
                           {&graph.input(DType::F32, {3, 5, 40}, 5), &graph.input(DType::F32, {3, 1, 40}, 6),
                            &graph.input(DType::F32, {5, 1}, 7)});
}

// Broadcast inputs stay one element for the binary ops (as either operand, or both) and are spread
// over a tile for a unary op, after which the binary ops read that tile.
TEST(FusedElementwise, ScalarAndPerRowOperandsEqualUnfusedF32) {
  Graph graph;
  ThreadPool threads(2);
  expectFusedEqualsUnfused(graph,
                           "sub f32 1 0; mul f32 1 2; exp f32 2; add f32 4 3; maximum f32 6 5; minimum f32 1 7; "
                           "div f32 8 2",
                           {&graph.input(DType::F32, {4, 300}, 20), &graph.input(DType::F32, {1}, 21),
                            &graph.input(DType::F32, {4, 1}, 22)},
                           &threads);
}

TEST(FusedElementwise, EveryUnaryMapEqualsUnfusedF32) {
  Graph graph;
  expectFusedEqualsUnfused(graph,
                           "exp f32 0; sqrt f32 1; rsqrt f32 2; log f32 3; neg f32 4; tanh f32 5; maximum f32 6 0; "
                           "minimum f32 7 0; gelu_tanh f32 8",
                           {&graph.input(DType::F32, {7, 129}, 8)});
}

TEST(FusedElementwise, SelectEqualsUnfused) {
  Graph graph;
  expectFusedEqualsUnfused(graph, "mul f32 1 1; select f32 0 3 2",
                           {&graph.input(DType::Bool, {6, 1}, 9), &graph.input(DType::F32, {6, 33}, 10),
                            &graph.input(DType::F32, {33}, 11)});
}

TEST(FusedElementwise, Bf16ChainRoundsWhereTheUnfusedStepsStore) {
  Graph graph;
  // bf16 intermediates, casts both ways, an f32 tail and a bf16 result.
  expectFusedEqualsUnfused(graph,
                           "add bf16 0 1; gelu_tanh bf16 3; cast f32 4; mul f32 5 2; exp f32 6; cast bf16 7; "
                           "div bf16 8 1; tanh bf16 9",
                           {&graph.input(DType::BF16, {2, 9, 70}, 12), &graph.input(DType::BF16, {70}, 13),
                            &graph.input(DType::F32, {2, 9, 70}, 14)});
}

TEST(FusedElementwise, F32ToBf16CastsEqualUnfused) {
  Graph graph;
  expectFusedEqualsUnfused(graph, "mul f32 0 0; cast bf16 1; exp bf16 2; cast f16 3; sqrt f16 4; cast f32 5",
                           {&graph.input(DType::F32, {5, 77}, 15)});
}

TEST(FusedElementwise, F64ChainEqualsUnfused) {
  Graph graph;
  expectFusedEqualsUnfused(graph, "add f64 0 1; gelu_tanh f64 2; exp f64 3; tanh f64 4",
                           {&graph.input(DType::F64, {4, 31}, 16), &graph.input(DType::F64, {4, 1}, 17)});
}

TEST(FusedElementwise, ThreadedChunksEqualUnfused) {
  ThreadPool threads(3);
  Graph graph;
  // Far more elements than one chunk, with a row length that is not a multiple of the tile.
  expectFusedEqualsUnfused(graph, "mul bf16 0 1; add bf16 2 0; gelu_tanh bf16 3",
                           {&graph.input(DType::BF16, {64, 1000}, 18), &graph.input(DType::BF16, {1000}, 19)},
                           &threads);
}

std::string creationError(const std::string& program, std::vector<std::pair<DType, std::vector<int64_t>>> inputs,
                          DType outputDType, std::vector<int64_t> outputShape) {
  Graph graph;
  std::vector<Tensor*> tensors;
  for (auto& [dtype, shape] : inputs) tensors.push_back(&graph.tensor(dtype, shape));
  Tensor& output = graph.tensor(outputDType, std::move(outputShape));
  try {
    graph.run("fused_elementwise", {{"program", program}}, tensors, output, nullptr);
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

TEST(FusedElementwise, RejectsBadPrograms) {
  EXPECT_NE(creationError("add f32 0", {{DType::F32, {4}}}, DType::F32, {4}).find("'add' takes 2 values, got 1"),
            std::string::npos);
  EXPECT_NE(creationError("exp f32 1", {{DType::F32, {4}}}, DType::F32, {4}).find("value '1' is not an input"),
            std::string::npos);
  EXPECT_NE(creationError("exp bf16 0", {{DType::F32, {4}}}, DType::BF16, {4}).find("expected bf16 values, got f32"),
            std::string::npos);
  EXPECT_NE(creationError("exp f32 0", {{DType::F32, {3}}}, DType::F32, {4}).find("does not broadcast"),
            std::string::npos);
  EXPECT_NE(creationError("exp f32 0", {{DType::F32, {4}}}, DType::F16, {4}).find("output y"), std::string::npos);
  EXPECT_NE(creationError("cast f64 0; add f64 1 1", {{DType::F32, {4}}}, DType::F64, {4}).find("mixes f64"),
            std::string::npos);
  EXPECT_NE(creationError("exp f32 0", {{DType::F32, {4}}, {DType::F32, {4}}}, DType::F32, {4}).find("never read"),
            std::string::npos);
}

}  // namespace
}  // namespace dgemma::test
