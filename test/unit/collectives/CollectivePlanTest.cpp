// The collectives through the compiler's planning stage and DgToPlan, run by the executor: in a
// group of one (LocalCommunicator), and as per-rank programs lowered for each rank
// (PlanLoweringOptions::rank) and run on two or three ranks over Gloo, which checks every
// derivative rule against finite differences across ranks.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "runtime/comm/GlooCommunicator.h"
#include "test/unit/comm/GlooRanks.h"
#include "runtime/exec/Executor.h"
#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"

namespace dgemma {
namespace {

// loss = sum(all_to_all(broadcast(w), counts).rows * c) + sum(reduce_to_root(w) * c2); the
// broadcast's input is also read by reduce_to_root, so the broadcast works on a copy.
constexpr const char* kProgram = R"mlir(
module attributes {dg.mesh = #dg.mesh<[ep = 1 (expert), tp = 1 (tensor)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4x2xf32>
  %counts = dg.input "counts" : tensor<1xi64>
  %c = dg.input "c" : tensor<6x2xf32>
  %c2 = dg.input "c2" : tensor<4x2xf32>
  %b = dg.broadcast %w axis = "tp" root = 0 : tensor<4x2xf32> -> tensor<4x2xf32>
  %rows, %received = dg.all_to_all %b, %counts axis = "ep" : tensor<4x2xf32>, tensor<1xi64> -> tensor<6x2xf32>, tensor<1xi64>
  %r = dg.reduce_to_root %w axis = "tp" root = 0 : tensor<4x2xf32> -> tensor<4x2xf32>
  %p = dg.mul %rows, %c : tensor<6x2xf32>, tensor<6x2xf32> -> tensor<6x2xf32>
  %q = dg.mul %r, %c2 : tensor<4x2xf32>, tensor<4x2xf32> -> tensor<4x2xf32>
  %sp = dg.reduce_sum %p dims = [0, 1] : tensor<6x2xf32> -> tensor<f32>
  %sq = dg.reduce_sum %q dims = [0, 1] : tensor<4x2xf32> -> tensor<f32>
  %l = dg.add %sp, %sq : tensor<f32>, tensor<f32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  dg.output "rows", %rows : tensor<6x2xf32>
  dg.output "received", %received : tensor<1xi64>
  return
}
}
)mlir";

HostTensor f32(std::vector<int64_t> shape, std::vector<float> values) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<float>());
  return tensor;
}

HostTensor counts(int64_t count) {
  HostTensor tensor(DType::I64, {1});
  tensor.as<int64_t>()[0] = count;
  return tensor;
}

std::vector<float> values(const HostTensor& tensor) {
  return std::vector<float>(tensor.as<float>(), tensor.as<float>() + tensor.numElements());
}

class CollectivePlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
    module = mlir::parseSourceString<mlir::ModuleOp>(kProgram, &context);
    ASSERT_TRUE(module);
    mlir::dg::PipelineOptions pipeline;
    pipeline.train = true;
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
    auto lowered = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
    ASSERT_TRUE(mlir::succeeded(lowered));
    plan = std::move(*lowered);
    entry = plan.selectEntry("train_step", {});
    ASSERT_NE(entry, nullptr);
  }

  mlir::MLIRContext context;
  mlir::OwningOpRef<mlir::ModuleOp> module;
  Plan plan;
  const EntryPoint* entry = nullptr;
};

TEST_F(CollectivePlanTest, EveryCollectiveAndItsAdjointIsACollectiveStepOnItsAxis) {
  std::map<std::string, int> collectives;
  for (const Step& step : entry->steps) {
    if (step.kind != Step::Kind::Collective) {
      EXPECT_TRUE(step.op != "broadcast" && step.op != "reduce_to_root" && step.op != "all_to_all") << step.op;
      continue;
    }
    ++collectives[step.op];
    if (step.op == "all_to_all") {
      EXPECT_EQ(step.axis, "ep");
      EXPECT_EQ(step.inputs.size(), 2u);
      EXPECT_EQ(step.outputs.size(), 2u);
      EXPECT_TRUE(step.attrs.empty()) << step.attrs.dump();
    } else {
      EXPECT_EQ(step.axis, "tp");
      EXPECT_EQ(step.attrs.value("root", int64_t{-1}), 0);
      EXPECT_EQ(step.outputs, step.inputs) << step.op << " works in place";
    }
  }
  // The forward's three, and the backward's adjoints: all_to_all back, reduce_to_root of the
  // broadcast and broadcast of the reduce_to_root.
  EXPECT_EQ(collectives, (std::map<std::string, int>{{"all_to_all", 2}, {"broadcast", 2}, {"reduce_to_root", 2}}));
}

TEST_F(CollectivePlanTest, RunsAndDifferentiatesInAGroupOfOne) {
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  CommunicatorSet communicators;
  communicators.add("tp", std::make_unique<LocalCommunicator>(*backend));
  communicators.add("ep", std::make_unique<LocalCommunicator>(*backend));
  Executor executor(plan, *backend, communicators, "collectives.dgplan");
  const std::vector<float> w = {1, 2, 3, 4, 5, 6, 7, 8};
  executor.setParameter("w", f32({4, 2}, w));
  std::vector<float> c, c2;
  for (int i = 0; i < 12; ++i) c.push_back(0.5f * float(i + 1));
  for (int i = 0; i < 8; ++i) c2.push_back(-float(i));
  auto outputs = executor.run(*entry, {{"counts", counts(3)}, {"c", f32({6, 2}, c)}, {"c2", f32({4, 2}, c2)}});

  // Three rows sent to itself; the capacity's other three rows are zero.
  EXPECT_EQ(values(outputs.at("rows")), (std::vector<float>{1, 2, 3, 4, 5, 6, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(outputs.at("received").as<int64_t>()[0], 3);
  // d loss / d w: c on the three sent rows, nothing on the unsent one (the reverse exchange's
  // zero tail), plus c2 through reduce_to_root and its broadcast adjoint.
  std::vector<float> expected;
  for (int i = 0; i < 8; ++i) expected.push_back((i < 6 ? c[i] : 0.0f) + c2[i]);
  EXPECT_EQ(values(outputs.at("grad/w")), expected);

  EXPECT_THROW(executor.run(*entry, {{"counts", counts(5)}, {"c", f32({6, 2}, c)}, {"c2", f32({4, 2}, c2)}}),
               RuntimeError);
}

// A sole-use collective works in place, except on a parameter: writing there would change the
// weights, so the plan copies the parameter into scratch first.
TEST(CollectivePlanLoweringTest, InPlaceCollectivesNeverWriteIntoAParameter) {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
module attributes {dg.mesh = #dg.mesh<[tp = 1 (tensor)]>} {
func.func @forward() attributes {dg.entry = "forward"} {
  %w = dg.param "w" : tensor<4xf32>
  %b = dg.broadcast %w axis = "tp" root = 0 : tensor<4xf32> -> tensor<4xf32>
  %e = dg.exp %b : tensor<4xf32>
  %r = dg.all_reduce %e axis = "tp" : tensor<4xf32> -> tensor<4xf32>
  dg.output "r", %r : tensor<4xf32>
  return
}
}
)mlir",
                                                        &context);
  ASSERT_TRUE(module);
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, mlir::dg::PipelineOptions{})));
  auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
  ASSERT_TRUE(mlir::succeeded(plan));
  const std::vector<Step>& steps = plan->entryPoints.at(0).steps;
  ASSERT_EQ(steps.size(), 4u);
  EXPECT_EQ(steps[0].op, "copy");
  EXPECT_EQ(steps[0].inputs.at(0), plan->parameters.at(0).buffer);
  EXPECT_EQ(steps[1].op, "broadcast");
  EXPECT_EQ(steps[1].inputs, steps[0].outputs);
  EXPECT_TRUE(plan->buffers.at(steps[1].inputs.at(0)).lifetime.has_value()) << "scratch, not the parameter";
  // The all-reduce of a sole-use scratch value needs no copy: it reduces exp's result in place.
  EXPECT_EQ(steps[2].op, "exp");
  EXPECT_EQ(steps[3].op, "all_reduce");
  EXPECT_EQ(steps[3].inputs, steps[2].outputs);
}

// A per-rank program lowers for any rank of its mesh, with row-major coordinates over the axes in
// the plan's order; without a rank, a multi-rank mesh is refused.
TEST(CollectivePlanLoweringTest, LowersAPerRankProgramForTheRankAsked) {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(R"mlir(
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), tp = 3 (tensor)]>} {
func.func @forward() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<4xf32>
  %r = dg.all_reduce %x axis = "tp" : tensor<4xf32> -> tensor<4xf32>
  dg.output "r", %r : tensor<4xf32>
  return
}
}
)mlir",
                                                        &context);
  ASSERT_TRUE(module);
  ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, mlir::dg::PipelineOptions{})));
  mlir::dg::PlanLoweringOptions options;
  options.rank = 4;
  auto plan = mlir::dg::lowerToPlan(*module, options);
  ASSERT_TRUE(mlir::succeeded(plan));
  EXPECT_EQ(plan->worldSize, 6);
  EXPECT_EQ(plan->rank, 4);
  ASSERT_EQ(plan->mesh.size(), 2u);
  EXPECT_EQ(plan->mesh[0].name, "dp");
  EXPECT_EQ(plan->mesh[0].coord, 1);
  EXPECT_EQ(plan->mesh[1].coord, 1);

  context.getDiagEngine().registerHandler([](mlir::Diagnostic&) { return mlir::success(); });  // expected errors
  options.rank = 6;
  EXPECT_TRUE(mlir::failed(mlir::dg::lowerToPlan(*module, options)));
  EXPECT_TRUE(mlir::failed(mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{})));
}

HostTensor f64(std::vector<int64_t> shape, std::vector<double> values) {
  HostTensor tensor(DType::F64, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<double>());
  return tensor;
}

// Distinct smooth values per rank and salt.
std::vector<double> drawn(int64_t count, int64_t rank, int64_t salt, double scale) {
  std::vector<double> values;
  for (int64_t i = 0; i < count; ++i)
    values.push_back(scale * std::sin(1.0 + 0.7 * double(i) + 2.0 * double(rank) + 3.1 * double(salt)));
  return values;
}

// Compiles `program` (one rank's program over a mesh of `ranks`, loss output "loss", one trainable
// f64 parameter "w") for each rank, runs every rank on its own thread over Gloo, and compares each
// rank's grad/w with central differences of the sum over ranks of the losses: what autodiff
// differentiates (docs/architecture.md, "Interfaces").
void expectGradientsMatchFiniteDifferences(const char* program, int64_t ranks,
                                           const std::function<std::map<std::string, HostTensor>(int64_t)>& inputsOf) {
  std::vector<Plan> plans;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    mlir::MLIRContext context;
    context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
    auto module = mlir::parseSourceString<mlir::ModuleOp>(program, &context);
    ASSERT_TRUE(module);
    mlir::dg::PipelineOptions pipeline;
    pipeline.train = true;
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
    mlir::dg::PlanLoweringOptions options;
    options.rank = rank;
    auto plan = mlir::dg::lowerToPlan(*module, options);
    ASSERT_TRUE(mlir::succeeded(plan));
    ASSERT_EQ(plan->worldSize, ranks);
    plans.push_back(std::move(*plan));
  }
  const Parameter* weight = nullptr;
  for (const Parameter& parameter : plans[0].parameters) weight = parameter.name == "w" ? &parameter : weight;
  ASSERT_NE(weight, nullptr);
  const std::vector<int64_t> shape = weight->shardShape;
  int64_t size = 1;
  for (int64_t extent : shape) size *= extent;

  const double h = 1e-5;
  // Run 0 is unperturbed; run 1 + 2 (size * s + j) + k moves w_s[j] by (k ? -h : +h).
  const int64_t runs = 1 + 2 * ranks * size;
  std::vector<std::vector<double>> losses(runs, std::vector<double>(ranks));
  std::vector<std::vector<double>> gradients(ranks);
  const std::vector<std::string> failures =
      test::runOnRanks(ranks, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        const Plan& plan = plans[rank];
        std::unique_ptr<Backend> backend = createBackend("cpu", 1);
        CommunicatorSet communicators;
        for (const MeshAxis& axis : plan.mesh)
          communicators.add(axis.name, createGlooCommunicator(store, rank, ranks, std::chrono::seconds(10)));
        Executor executor(plan, *backend, communicators, "rank.dgplan");
        const EntryPoint* entry = plan.selectEntry("train_step", {});
        const std::vector<double> w = drawn(size, rank, 0, 0.3);
        const std::map<std::string, HostTensor> inputs = inputsOf(rank);
        for (int64_t run = 0; run < runs; ++run) {
          std::vector<double> moved = w;
          if (run > 0 && (run - 1) / (2 * size) == rank) moved[(run - 1) / 2 % size] += (run - 1) % 2 ? -h : h;
          executor.setParameter("w", f64(shape, moved));
          auto outputs = executor.run(*entry, inputs);
          losses[run][rank] = outputs.at("loss").as<double>()[0];
          if (run == 0) {
            const HostTensor& gradient = outputs.at("grad/w");
            gradients[rank].assign(gradient.as<double>(), gradient.as<double>() + size);
          }
        }
      });
  for (int64_t rank = 0; rank < ranks; ++rank) ASSERT_EQ(failures[rank], "") << "rank " << rank;

  auto totalLoss = [&](int64_t run) {
    double total = 0;
    for (double loss : losses[run]) total += loss;
    return total;
  };
  for (int64_t s = 0; s < ranks; ++s)
    for (int64_t j = 0; j < size; ++j) {
      int64_t run = 1 + 2 * (size * s + j);
      double numeric = (totalLoss(run) - totalLoss(run + 1)) / (2 * h);
      EXPECT_NEAR(gradients[s][j], numeric, 1e-7 * std::max(1.0, std::abs(numeric))) << "rank " << s << " w[" << j << "]";
    }
}

TEST(CollectiveGradientTest, AllReduceBroadcastAndReduceToRootOverTwoRanks) {
  // L_r = sum(c * exp(all_reduce(w))) + sum(d * broadcast(w)^2) + sum(c * reduce_to_root(w * w)).
  expectGradientsMatchFiniteDifferences(R"mlir(
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<3xf64>
  %c = dg.input "c" : tensor<3xf64>
  %d = dg.input "d" : tensor<3xf64>
  %a = dg.all_reduce %w axis = "tp" : tensor<3xf64> -> tensor<3xf64>
  %e = dg.exp %a : tensor<3xf64>
  %b = dg.broadcast %w axis = "tp" root = 1 : tensor<3xf64> -> tensor<3xf64>
  %bb = dg.mul %b, %b : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %ww = dg.mul %w, %w : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %r = dg.reduce_to_root %ww axis = "tp" root = 1 : tensor<3xf64> -> tensor<3xf64>
  %t1 = dg.mul %e, %c : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %t2 = dg.mul %bb, %d : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %t3 = dg.mul %r, %c : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %s12 = dg.add %t1, %t2 : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %s = dg.add %s12, %t3 : tensor<3xf64>, tensor<3xf64> -> tensor<3xf64>
  %l = dg.reduce_sum %s dims = [0] : tensor<3xf64> -> tensor<f64>
  dg.output "loss", %l : tensor<f64>
  return
}
}
)mlir",
                                        2, [](int64_t rank) {
                                          return std::map<std::string, HostTensor>{
                                              {"c", f64({3}, drawn(3, rank, 1, 1.0))},
                                              {"d", f64({3}, drawn(3, rank, 2, 1.0))}};
                                        });
}

TEST(CollectiveGradientTest, AllGatherAndReduceScatterOverThreeRanks) {
  // L_r = sum(d * reduce_scatter(c * exp(all_gather(w)))) + sum(e * all_gather(w)^2).
  expectGradientsMatchFiniteDifferences(R"mlir(
module attributes {dg.mesh = #dg.mesh<[tp = 3 (tensor)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<2x2xf64>
  %c = dg.input "c" : tensor<6x2xf64>
  %d = dg.input "d" : tensor<2x2xf64>
  %g = dg.all_gather %w axis = "tp" : tensor<2x2xf64> -> tensor<6x2xf64>
  %x = dg.exp %g : tensor<6x2xf64>
  %cx = dg.mul %x, %c : tensor<6x2xf64>, tensor<6x2xf64> -> tensor<6x2xf64>
  %s = dg.reduce_scatter %cx axis = "tp" : tensor<6x2xf64> -> tensor<2x2xf64>
  %ds = dg.mul %s, %d : tensor<2x2xf64>, tensor<2x2xf64> -> tensor<2x2xf64>
  %gg = dg.mul %g, %g : tensor<6x2xf64>, tensor<6x2xf64> -> tensor<6x2xf64>
  %l1 = dg.reduce_sum %ds dims = [0, 1] : tensor<2x2xf64> -> tensor<f64>
  %l2 = dg.reduce_sum %gg dims = [0, 1] : tensor<6x2xf64> -> tensor<f64>
  %l = dg.add %l1, %l2 : tensor<f64>, tensor<f64> -> tensor<f64>
  dg.output "loss", %l : tensor<f64>
  return
}
}
)mlir",
                                        3, [](int64_t rank) {
                                          return std::map<std::string, HostTensor>{
                                              {"c", f64({6, 2}, drawn(12, rank, 1, 1.0))},
                                              {"d", f64({2, 2}, drawn(4, rank, 2, 1.0))}};
                                        });
}

TEST(CollectiveGradientTest, RaggedAllToAllOverThreeRanksWithUnevenAndZeroCounts) {
  // Rank r sends (r + p) % 3 rows to rank p: three of its four rows (the fourth gets no gradient),
  // zero rows to one peer; it receives three rows into a capacity of six. L_r = sum(c * exp(rows
  // received)), the zero tail included (a constant).
  expectGradientsMatchFiniteDifferences(R"mlir(
module attributes {dg.mesh = #dg.mesh<[ep = 3 (expert)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %w = dg.param "w" : tensor<4x2xf64>
  %counts = dg.input "counts" : tensor<3xi64>
  %c = dg.input "c" : tensor<6x2xf64>
  %y, %n = dg.all_to_all %w, %counts axis = "ep" : tensor<4x2xf64>, tensor<3xi64> -> tensor<6x2xf64>, tensor<3xi64>
  %e = dg.exp %y : tensor<6x2xf64>
  %ce = dg.mul %e, %c : tensor<6x2xf64>, tensor<6x2xf64> -> tensor<6x2xf64>
  %l = dg.reduce_sum %ce dims = [0, 1] : tensor<6x2xf64> -> tensor<f64>
  dg.output "loss", %l : tensor<f64>
  return
}
}
)mlir",
                                        3, [](int64_t rank) {
                                          HostTensor counts(DType::I64, {3});
                                          for (int64_t peer = 0; peer < 3; ++peer)
                                            counts.as<int64_t>()[peer] = (rank + peer) % 3;
                                          return std::map<std::string, HostTensor>{
                                              {"counts", counts}, {"c", f64({6, 2}, drawn(12, rank, 1, 1.0))}};
                                        });
}

}  // namespace
}  // namespace dgemma
