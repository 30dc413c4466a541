// dg.canvas_sample from the IR to a run: the planner and the plan lowering make it one kernel step
// (three inputs, four outputs), and the CPU backend runs it with a bf16 scaled result that dg.assign
// stores into a persistent parameter, the way a denoise entry keeps its self-conditioning logits.
// The kernel's arithmetic itself is tested in test/unit/kernels/CanvasSampleTest.cpp; here the
// outputs are checked against the documented recipe (docs/kernels.md, "canvas_sample").
#include <gtest/gtest.h>

#include <random>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "runtime/core/Philox.h"
#include "runtime/exec/Executor.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/kernels/canvas_sample/GumbelNoise.h"
#include "support/DType.h"

namespace dgemma {
namespace {

constexpr int64_t kBatch = 2, kCanvas = 3, kVocab = 37;

constexpr const char* kDenoiseTail = R"mlir(
func.func @sample_step() attributes {dg.entry = "sample_step"} {
  %logits = dg.input "logits" : tensor<2x3x37xf32>
  %t = dg.input "temperature" : tensor<2xf32>
  %key = dg.input "sample_keys" : tensor<2x2xi64>
  %previous = dg.param "generate/self_conditioning_logits" {trainable = false} : tensor<2x3x37xbf16>
  %s, %a, %h, %z = dg.canvas_sample %logits, %t, %key : tensor<2x3x37xf32>, tensor<2xf32>, tensor<2x2xi64> -> tensor<2x3xi64>, tensor<2x3xi64>, tensor<2x3xf32>, tensor<2x3x37xbf16>
  dg.assign %z to %previous : tensor<2x3x37xbf16>
  dg.output "sampled_ids", %s : tensor<2x3xi64>
  dg.output "argmax_ids", %a : tensor<2x3xi64>
  dg.output "entropy", %h : tensor<2x3xf32>
  return
}
)mlir";

TEST(CanvasSamplePlan, LowersToOneKernelStepThatRunsOnTheCpuBackend) {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(kDenoiseTail, &context);
  ASSERT_TRUE(module);
  mlir::dg::PipelineOptions pipeline;
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
  auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
  ASSERT_TRUE(mlir::succeeded(plan));
  const EntryPoint* denoise = plan->selectEntry("sample_step", {});
  ASSERT_NE(denoise, nullptr);
  int64_t samplerSteps = 0;
  for (const Step& step : denoise->steps) {
    if (step.op != "canvas_sample") continue;
    ++samplerSteps;
    EXPECT_EQ(step.kind, Step::Kind::Kernel);
    ASSERT_EQ(step.inputs.size(), 3u);
    ASSERT_EQ(step.outputs.size(), 4u);
    EXPECT_EQ(plan->buffers[step.outputs[0]].dtype, DType::I64);
    EXPECT_EQ(plan->buffers[step.outputs[2]].dtype, DType::F32);
    EXPECT_EQ(plan->buffers[step.outputs[3]].dtype, DType::BF16);
    EXPECT_EQ(plan->buffers[step.outputs[3]].shape, (std::vector<int64_t>{kBatch, kCanvas, kVocab}));
  }
  EXPECT_EQ(samplerSteps, 1);

  std::unique_ptr<Backend> backend = createBackend("cpu", 2);
  CommunicatorSet communicators;
  Executor executor(*plan, *backend, communicators, "canvas-sample-plan-test");
  HostTensor logits(DType::F32, {kBatch, kCanvas, kVocab}), temperature(DType::F32, {kBatch}), keys(DType::I64, {kBatch, 2});
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < logits.numElements(); ++i) logits.as<float>()[i] = normal(rng);
  temperature.as<float>()[0] = 0.8f;
  temperature.as<float>()[1] = 0.45f;
  const int64_t keyValues[] = {12345, 0, -77, 9};
  std::copy(std::begin(keyValues), std::end(keyValues), keys.as<int64_t>());
  std::map<std::string, HostTensor> outputs =
      executor.run(*denoise, {{"logits", logits}, {"temperature", temperature}, {"sample_keys", keys}});
  const HostTensor stored = executor.parameter("generate/self_conditioning_logits");

  for (int64_t b = 0; b < kBatch; ++b)
    for (int64_t l = 0; l < kCanvas; ++l) {
      const int64_t position = b * kCanvas + l;
      int64_t argmax = 0, sampled = 0;
      float bestKey = -INFINITY;
      for (int64_t v = 0; v < kVocab; ++v) {
        const float z = logits.as<float>()[position * kVocab + v] / temperature.as<float>()[b];
        ASSERT_EQ(stored.as<uint16_t>()[position * kVocab + v], f32ToBf16Bits(z)) << position << ", " << v;
        if (z > logits.as<float>()[position * kVocab + argmax] / temperature.as<float>()[b]) argmax = v;
        const uint32_t word = philoxWord(static_cast<uint64_t>(keyValues[2 * b]), 0, static_cast<uint64_t>(keyValues[2 * b + 1]),
                                         static_cast<uint64_t>(l * kVocab + v));
        const float key = z + canvas_sample::gumbelNoise(word);
        if (key > bestKey) bestKey = key, sampled = v;
      }
      EXPECT_EQ(outputs.at("argmax_ids").as<int64_t>()[position], argmax) << position;
      EXPECT_EQ(outputs.at("sampled_ids").as<int64_t>()[position], sampled) << position;
      const float entropy = outputs.at("entropy").as<float>()[position];
      EXPECT_GT(entropy, 0.0f);
      EXPECT_LT(entropy, std::log(static_cast<float>(kVocab)));
    }
}

}  // namespace
}  // namespace dgemma
