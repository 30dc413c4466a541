// The optimizer_step entry that dg-optimizer-step adds, compiled to a plan and run on the CPU
// backend, against AdamW written out in double (docs/training.md): three steps with gradient
// accumulation scaling, one of them clipped, weight decay on, a frozen parameter left alone. The
// gradients come from their device buffers (dg-gradient-buffers), which the step zeroes; train_step
// adds into them, micro-batch after micro-batch, exactly as f32 addition does.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/exec/Executor.h"

namespace dgemma {
namespace {

constexpr const char* kTrainStep = R"mlir(
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<2x3xf32>
  %b = dg.param "b" : tensor<3xf32>
  %frozen = dg.param "frozen" {trainable = false} : tensor<3xf32>
  %y = dg.add %w, %b : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %z = dg.mul %y, %frozen : tensor<2x3xf32>, tensor<3xf32> -> tensor<2x3xf32>
  %l = dg.reduce_sum %z dims = [0, 1] : tensor<2x3xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  return
}
)mlir";

HostTensor scalar(float value) {
  HostTensor tensor(DType::F32, {});
  tensor.as<float>()[0] = value;
  return tensor;
}

HostTensor filled(std::vector<int64_t> shape, const std::vector<double>& values) {
  HostTensor tensor(DType::F32, std::move(shape));
  for (size_t i = 0; i < values.size(); ++i) tensor.as<float>()[i] = static_cast<float>(values[i]);
  return tensor;
}

// AdamW as docs/training.md writes it, in double.
struct ReferenceAdam {
  dgemma::OptimizerSettings options;
  std::map<std::string, std::vector<double>> weights, first, second;

  double step(int64_t n, double lr, double gradientScale, std::map<std::string, std::vector<double>> gradients) {
    double squares = 0;
    for (auto& [name, gradient] : gradients)
      for (double& g : gradient) {
        g *= gradientScale;
        squares += g * g;
      }
    const double norm = std::sqrt(squares);
    const double clip = std::min(options.maxGradNorm / (norm + 1e-6), 1.0);
    for (auto& [name, gradient] : gradients) {
      std::vector<double>& p = weights[name];
      first[name].resize(p.size());
      second[name].resize(p.size());
      for (size_t i = 0; i < p.size(); ++i) {
        const double g = gradient[i] * clip;
        double& m = first[name][i];
        double& v = second[name][i];
        m = options.beta1 * m + (1 - options.beta1) * g;
        v = options.beta2 * v + (1 - options.beta2) * g * g;
        const double adam = (m / (1 - std::pow(options.beta1, n))) / (std::sqrt(v / (1 - std::pow(options.beta2, n))) + options.epsilon);
        p[i] -= lr * (adam + options.weightDecay * p[i]);
      }
    }
    return norm;
  }
};

void expectClose(const HostTensor& actual, const std::vector<double>& expected, const std::string& what) {
  ASSERT_EQ(actual.numElements(), static_cast<int64_t>(expected.size())) << what;
  for (size_t i = 0; i < expected.size(); ++i)
    EXPECT_NEAR(actual.as<float>()[i], expected[i], 2e-6 * std::max(1.0, std::abs(expected[i]))) << what << "[" << i << "]";
}

TEST(OptimizerStep, MatchesAdamWInDouble) {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(kTrainStep, &context);
  ASSERT_TRUE(module);
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = true;
  pipeline.optimizer = dgemma::OptimizerSettings{0.8, 0.95, 1e-8, 0.1, 1.5};
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
  auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
  ASSERT_TRUE(mlir::succeeded(plan));
  std::unique_ptr<Backend> backend = createBackend("cpu", 2);
  CommunicatorSet communicators;
  Executor executor(*plan, *backend, communicators, "optimizer-step-test");
  const EntryPoint* update = plan->selectEntry("optimizer_step", {});
  ASSERT_NE(update, nullptr);

  ReferenceAdam reference{*pipeline.optimizer, {}, {}, {}};
  reference.weights["w"] = {0.5, -1.0, 2.0, 0.25, -0.75, 1.5};
  reference.weights["b"] = {0.1, 0.2, -0.3};
  executor.setParameter("w", filled({2, 3}, reference.weights["w"]));
  executor.setParameter("b", filled({3}, reference.weights["b"]));
  executor.setParameter("frozen", filled({3}, {1, 2, 3}));
  // Parameters round to f32 once; the reference starts from the same rounded values.
  for (auto& [name, values] : reference.weights)
    for (double& value : values) value = static_cast<float>(value);

  std::mt19937 rng(5);
  std::normal_distribution<double> normal(0.0, 1.0);
  const double accumulation = 2;  // two micro-batches summed
  const std::vector<std::pair<double, double>> steps = {{1e-2, 0.1}, {2e-2, 3.0}, {5e-3, 0.2}};  // (lr, gradient size)
  for (size_t n = 1; n <= steps.size(); ++n) {
    auto [lr, size] = steps[n - 1];
    std::map<std::string, std::vector<double>> gradients = {{"w", std::vector<double>(6)}, {"b", std::vector<double>(3)}};
    for (auto& [name, gradient] : gradients)
      for (double& g : gradient) g = static_cast<float>(size * normal(rng));
    const auto& options = reference.options;
    std::map<std::string, HostTensor> inputs = {
        {"lr", scalar(static_cast<float>(lr))},
        {"bias_correction1", scalar(static_cast<float>(1 - std::pow(options.beta1, n)))},
        {"bias_correction2", scalar(static_cast<float>(1 - std::pow(options.beta2, n)))},
        {"gradient_scale", scalar(static_cast<float>(1 / accumulation))}};
    executor.setParameter("grad/w", filled({2, 3}, gradients["w"]));
    executor.setParameter("grad/b", filled({3}, gradients["b"]));
    std::map<std::string, HostTensor> outputs = executor.run(*update, inputs);
    expectClose(executor.parameter("grad/w"), std::vector<double>(6, 0.0), "grad/w after the update");
    expectClose(executor.parameter("grad/b"), std::vector<double>(3, 0.0), "grad/b after the update");
    const double norm = reference.step(static_cast<int64_t>(n), static_cast<float>(lr), 1 / accumulation, gradients);
    EXPECT_NEAR(outputs.at("grad_norm").as<float>()[0], norm, 1e-6 * norm) << "step " << n;
    if (n == 2) {
      EXPECT_GT(norm, options.maxGradNorm) << "the second step is meant to be clipped";
    }
    for (const char* name : {"w", "b"}) {
      expectClose(executor.parameter(name), reference.weights[name], std::string(name) + " after step " + std::to_string(n));
      expectClose(executor.parameter(std::string("optimizer/exp_avg/") + name), reference.first[name], "exp_avg");
      expectClose(executor.parameter(std::string("optimizer/exp_avg_sq/") + name), reference.second[name], "exp_avg_sq");
    }
  }
  expectClose(executor.parameter("frozen"), {1, 2, 3}, "frozen");
}

// train_step sums into the buffers: d loss / d w = frozen (broadcast over rows), d loss / d b =
// 2 * frozen; two micro-batches give twice that. gradient_check
// flags a buffer with a NaN, and zero_gradients clears every buffer.
TEST(OptimizerStep, TrainStepAccumulatesIntoBuffersThatTheCheckAndZeroEntriesSee) {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  mlir::OwningOpRef<mlir::ModuleOp> module = mlir::parseSourceString<mlir::ModuleOp>(kTrainStep, &context);
  ASSERT_TRUE(module);
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = true;
  pipeline.optimizer = dgemma::OptimizerSettings{};
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
  auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
  ASSERT_TRUE(mlir::succeeded(plan));
  std::unique_ptr<Backend> backend = createBackend("cpu", 2);
  CommunicatorSet communicators;
  Executor executor(*plan, *backend, communicators, "gradient-buffers-test");
  const float third = 1.0f / 3.0f;
  executor.setParameter("w", filled({2, 3}, {0, 0, 0, 0, 0, 0}));
  executor.setParameter("b", filled({3}, {0, 0, 0}));
  executor.setParameter("frozen", filled({3}, {third, 2, -3}));
  executor.setParameter("grad/w", filled({2, 3}, {0, 0, 0, 0, 0, 0}));
  executor.setParameter("grad/b", filled({3}, {0, 0, 0}));
  const EntryPoint* trainStep = plan->selectEntry("train_step", {});
  ASSERT_NE(trainStep, nullptr);
  std::map<std::string, HostTensor> outputs = executor.run(*trainStep, {});
  EXPECT_EQ(outputs.count("grad/w"), 0u) << "the gradients stay on the device";
  executor.run(*trainStep, {});
  const HostTensor w = executor.parameter("grad/w");
  const HostTensor b = executor.parameter("grad/b");
  const float expectedB[] = {(third + third) + (third + third), 8.0f, -12.0f};
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(b.as<float>()[i], expectedB[i]) << "grad/b[" << i << "]";
    EXPECT_EQ(w.as<float>()[i], expectedB[i] / 2) << "grad/w[" << i << "]";
  }

  const EntryPoint* check = plan->selectEntry("gradient_check", {});
  const EntryPoint* zero = plan->selectEntry("zero_gradients", {});
  ASSERT_NE(check, nullptr);
  ASSERT_NE(zero, nullptr);
  std::map<std::string, HostTensor> flags = executor.run(*check, {});
  EXPECT_EQ(flags.at("nonfinite/grad/w").as<float>()[0], 0.0f);
  EXPECT_EQ(flags.at("nonfinite/grad/b").as<float>()[0], 0.0f);
  executor.setParameter("grad/b", filled({3}, {1, std::numeric_limits<double>::infinity(), 2}));
  flags = executor.run(*check, {});
  EXPECT_EQ(flags.at("nonfinite/grad/w").as<float>()[0], 0.0f);
  EXPECT_TRUE(std::isnan(flags.at("nonfinite/grad/b").as<float>()[0]));

  executor.run(*zero, {});
  expectClose(executor.parameter("grad/w"), std::vector<double>(6, 0.0), "grad/w after zero_gradients");
  expectClose(executor.parameter("grad/b"), std::vector<double>(3, 0.0), "grad/b after zero_gradients");
}

}  // namespace
}  // namespace dgemma
