// Expert parallelism's all-to-all form end to end: the all-gather form of dg.moe_experts and its
// backward, written per rank as the partitioner emits it (docs/parallelism.md, "Expert
// parallelism"), rewritten by dg-expert-dispatch, planned, lowered for each rank and run on two
// Gloo ranks, gives each rank's block of the outputs and gradients that one rank computes with every
// token and every expert. So does the rewritten forward alone differentiated by dg-autodiff (the
// dispatch ops' derivative rules).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <map>
#include <set>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "runtime/comm/GlooCommunicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/kernel_api/Backend.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

// Two ranks of ep = 2, 3 tokens each, hidden 4, top-2 of 4 experts (2 per rank), expert hidden 3.
constexpr int64_t kRanks = 2, kTokens = 3, kHidden = 4, kTopK = 2, kLocalExperts = 2, kInner = 3;

// Rank `rank`'s program in the all-gather form: x, the weights and the output gradient are gathered
// over ep, the indices are whole on every rank, the experts carry their offset, and the partial
// results are reduce-scattered.
std::string withOffset(std::string program, int64_t rank) {
  const std::string offset = std::to_string(rank * kLocalExperts);
  for (size_t at = program.find("OFFSET"); at != std::string::npos; at = program.find("OFFSET"))
    program.replace(at, 6, offset);
  return program;
}

std::string allGatherForm(int64_t rank) {
  return withOffset(R"mlir(
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<3x4xf32>
  %w = dg.input "w" : tensor<3x2xf32>
  %i = dg.input "i" : tensor<6x2xi64>
  %dy = dg.input "dy" : tensor<3x4xf32>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  %xg = dg.all_gather %x axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %wg = dg.all_gather %w axis = "ep" : tensor<3x2xf32> -> tensor<6x2xf32>
  %yg = dg.moe_experts %xg, %wg, %i, %gu, %d {expert_offset = OFFSET : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %y = dg.reduce_scatter %yg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  %dyg = dg.all_gather %dy axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %dxg, %dwg, %dgu, %dd = dg.moe_experts_backward %xg, %wg, %i, %gu, %d, %dyg {expert_offset = OFFSET : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32>, tensor<6x4xf32> -> tensor<6x4xf32>, tensor<6x2xf32> grad_gate_up tensor<2x6x4xf32> grad_down tensor<2x4x3xf32>
  %dx = dg.reduce_scatter %dxg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  %dw = dg.reduce_scatter %dwg axis = "ep" : tensor<6x2xf32> -> tensor<3x2xf32>
  dg.output "y", %y : tensor<3x4xf32>
  dg.output "dx", %dx : tensor<3x4xf32>
  dg.output "dw", %dw : tensor<3x2xf32>
  dg.output "dgu", %dgu : tensor<2x6x4xf32>
  dg.output "dd", %dd : tensor<2x4x3xf32>
  return
}
}
)mlir",
                    rank);
}

// The forward alone, with x and the routing weights as parameters and loss = sum(dy * y): its
// gradients are the backward's with output gradient dy.
std::string allGatherForward(int64_t rank) {
  return withOffset(R"mlir(
module attributes {dg.mesh = #dg.mesh<[ep = 2 (expert)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %x = dg.param "x" : tensor<3x4xf32>
  %w = dg.param "w" : tensor<3x2xf32>
  %i = dg.input "i" : tensor<6x2xi64>
  %dy = dg.input "dy" : tensor<3x4xf32>
  %gu = dg.param "gate_up" : tensor<2x6x4xf32>
  %d = dg.param "down" : tensor<2x4x3xf32>
  %xg = dg.all_gather %x axis = "ep" : tensor<3x4xf32> -> tensor<6x4xf32>
  %wg = dg.all_gather %w axis = "ep" : tensor<3x2xf32> -> tensor<6x2xf32>
  %yg = dg.moe_experts %xg, %wg, %i, %gu, %d {expert_offset = OFFSET : i64} : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<2x6x4xf32>, tensor<2x4x3xf32> -> tensor<6x4xf32>
  %y = dg.reduce_scatter %yg axis = "ep" : tensor<6x4xf32> -> tensor<3x4xf32>
  %p = dg.mul %y, %dy : tensor<3x4xf32>, tensor<3x4xf32> -> tensor<3x4xf32>
  %l = dg.reduce_sum %p dims = [0, 1] : tensor<3x4xf32> -> tensor<f32>
  dg.output "loss", %l : tensor<f32>
  dg.output "y", %y : tensor<3x4xf32>
  return
}
}
)mlir",
                    rank);
}

// The same computation on one rank: every token, every expert.
constexpr const char* kOneRank = R"mlir(
module {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" : tensor<6x4xf32>
  %w = dg.input "w" : tensor<6x2xf32>
  %i = dg.input "i" : tensor<6x2xi64>
  %dy = dg.input "dy" : tensor<6x4xf32>
  %gu = dg.param "gate_up" : tensor<4x6x4xf32>
  %d = dg.param "down" : tensor<4x4x3xf32>
  %y = dg.moe_experts %x, %w, %i, %gu, %d : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<4x6x4xf32>, tensor<4x4x3xf32> -> tensor<6x4xf32>
  %dx, %dw, %dgu, %dd = dg.moe_experts_backward %x, %w, %i, %gu, %d, %dy : tensor<6x4xf32>, tensor<6x2xf32>, tensor<6x2xi64>, tensor<4x6x4xf32>, tensor<4x4x3xf32>, tensor<6x4xf32> -> tensor<6x4xf32>, tensor<6x2xf32> grad_gate_up tensor<4x6x4xf32> grad_down tensor<4x4x3xf32>
  dg.output "y", %y : tensor<6x4xf32>
  dg.output "dx", %dx : tensor<6x4xf32>
  dg.output "dw", %dw : tensor<6x2xf32>
  dg.output "dgu", %dgu : tensor<4x6x4xf32>
  dg.output "dd", %dd : tensor<4x4x3xf32>
  return
}
}
)mlir";

// Parses `program`, runs dg-expert-dispatch when asked, then differentiates it when `train`, plans
// it and lowers it for `rank`.
Plan compile(const std::string& program, bool dispatch, bool train, std::optional<int64_t> rank) {
  mlir::MLIRContext context;
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  auto module = mlir::parseSourceString<mlir::ModuleOp>(program, &context);
  EXPECT_TRUE(module);
  if (dispatch) {
    mlir::PassManager passes(&context);
    passes.addNestedPass<mlir::func::FuncOp>(mlir::dg::createDgExpertDispatch());
    EXPECT_TRUE(mlir::succeeded(passes.run(*module)));
  }
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = train;
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
  mlir::dg::PlanLoweringOptions options;
  options.rank = rank;
  auto plan = mlir::dg::lowerToPlan(*module, options);
  EXPECT_TRUE(mlir::succeeded(plan));
  return std::move(*plan);
}

HostTensor f32(std::vector<int64_t> shape, const std::vector<float>& values) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<float>());
  return tensor;
}

std::vector<float> drawn(int64_t count, int64_t salt, float scale) {
  std::vector<float> values;
  for (int64_t i = 0; i < count; ++i) values.push_back(scale * float(std::sin(0.9 + 0.61 * double(i) + 1.7 * double(salt))));
  return values;
}

std::vector<float> values(const HostTensor& tensor) {
  return std::vector<float>(tensor.as<float>(), tensor.as<float>() + tensor.numElements());
}

// Block `block` of `count` elements.
std::vector<float> blockOf(const std::vector<float>& all, int64_t block, int64_t count) {
  return std::vector<float>(all.begin() + block * count, all.begin() + (block + 1) * count);
}

void expectNear(const std::vector<float>& actual, const std::vector<float>& expected, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_NEAR(actual[i], expected[i], 1e-6 * std::max(1.0f, std::abs(expected[i]))) << what << "[" << i << "]";
}

// How a rank's program hands out what the one-rank program calls y, dx, dw, dgu and dd.
struct Variant {
  std::function<std::string(int64_t rank)> program;
  bool train = false;               // the forward differentiated: x and w are parameters
  std::map<std::string, std::string> outputOf;  // one-rank output name -> the rank's output name
};

const Variant kWrittenBackward{allGatherForm, false,
                               {{"y", "y"}, {"dx", "dx"}, {"dw", "dw"}, {"dgu", "dgu"}, {"dd", "dd"}}};
const Variant kDifferentiatedForward{
    allGatherForward, true,
    {{"y", "y"}, {"dx", "grad/x"}, {"dw", "grad/w"}, {"dgu", "grad/gate_up"}, {"dd", "grad/down"}}};

// Runs the rewritten program on two Gloo ranks with global indices `indices` ([6, 2]) and compares
// every rank's outputs with its block of the one-rank results.
void expectDispatchMatchesOneRank(const Variant& variant, const std::vector<int64_t>& indices) {
  const int64_t allTokens = kRanks * kTokens, experts = kRanks * kLocalExperts;
  const std::vector<float> x = drawn(allTokens * kHidden, 1, 1.0f), w = drawn(allTokens * kTopK, 2, 0.8f),
                           dy = drawn(allTokens * kHidden, 3, 1.0f), gateUp = drawn(experts * 2 * kInner * kHidden, 4, 0.6f),
                           down = drawn(experts * kHidden * kInner, 5, 0.6f);
  HostTensor indexTensor(DType::I64, {allTokens, kTopK});
  std::copy(indices.begin(), indices.end(), indexTensor.as<int64_t>());

  const Plan whole = compile(kOneRank, false, false, std::nullopt);
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  CommunicatorSet none;
  Executor reference(whole, *backend, none, "one-rank.dgplan");
  reference.setParameter("gate_up", f32({experts, 2 * kInner, kHidden}, gateUp));
  reference.setParameter("down", f32({experts, kHidden, kInner}, down));
  auto expected = reference.run(*whole.selectEntry("train_step", {}),
                                {{"x", f32({allTokens, kHidden}, x)}, {"w", f32({allTokens, kTopK}, w)}, {"i", indexTensor},
                                 {"dy", f32({allTokens, kHidden}, dy)}});

  std::vector<Plan> plans;
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    plans.push_back(compile(variant.program(rank), true, variant.train, rank));
    std::set<std::string> ops;
    for (const Step& step : plans.back().selectEntry("train_step", {})->steps) ops.insert(step.op);
    EXPECT_TRUE(ops.count("moe_dispatch") && ops.count("all_to_all") && ops.count("moe_local_experts_backward"));
    EXPECT_FALSE(ops.count("all_gather") || ops.count("reduce_scatter") || ops.count("moe_experts")) << "rank " << rank;
  }
  std::vector<std::map<std::string, HostTensor>> outputs(kRanks);
  const std::vector<std::string> failures =
      test::runOnRanks(kRanks, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        const Plan& plan = plans[rank];
        std::unique_ptr<Backend> rankBackend = createBackend("cpu", 1);
        CommunicatorSet communicators;
        communicators.add("ep", createGlooCommunicator(store, rank, kRanks, std::chrono::seconds(10)));
        Executor executor(plan, *rankBackend, communicators, "rank.dgplan");
        const int64_t expertBlock = kLocalExperts * 2 * kInner * kHidden, downBlock = kLocalExperts * kHidden * kInner;
        executor.setParameter("gate_up", f32({kLocalExperts, 2 * kInner, kHidden}, blockOf(gateUp, rank, expertBlock)));
        executor.setParameter("down", f32({kLocalExperts, kHidden, kInner}, blockOf(down, rank, downBlock)));
        std::map<std::string, HostTensor> inputs{{"i", indexTensor},
                                                 {"dy", f32({kTokens, kHidden}, blockOf(dy, rank, kTokens * kHidden))}};
        HostTensor localX = f32({kTokens, kHidden}, blockOf(x, rank, kTokens * kHidden));
        HostTensor localW = f32({kTokens, kTopK}, blockOf(w, rank, kTokens * kTopK));
        if (variant.train) {
          executor.setParameter("x", localX);
          executor.setParameter("w", localW);
        } else {
          inputs.emplace("x", localX);
          inputs.emplace("w", localW);
        }
        outputs[rank] = executor.run(*plan.selectEntry("train_step", {}), inputs);
      });
  const std::map<std::string, int64_t> blockSize{{"y", kTokens * kHidden},
                                                 {"dx", kTokens * kHidden},
                                                 {"dw", kTokens * kTopK},
                                                 {"dgu", kLocalExperts * 2 * kInner * kHidden},
                                                 {"dd", kLocalExperts * kHidden * kInner}};
  for (int64_t rank = 0; rank < kRanks; ++rank) {
    ASSERT_EQ(failures[rank], "") << "rank " << rank;
    for (const auto& [name, size] : blockSize) {
      const std::string& output = variant.outputOf.at(name);
      expectNear(values(outputs[rank].at(output)), blockOf(values(expected.at(name)), rank, size),
                 output + " on rank " + std::to_string(rank));
    }
  }
}

// Routes of both ranks' tokens to experts on both ranks, some to the rank's own.
const std::vector<int64_t> kSpreadRoutes{0, 3, 2, 1, 3, 0, 1, 2, 2, 3, 0, 1};
// Every route goes to rank 0's experts 0 and 1: rank 1 receives nothing, its experts' gradients
// are zero, and its tokens still go out and come back combined.
const std::vector<int64_t> kRoutesToRankZero{0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0};

TEST(ExpertDispatchPlanTest, TwoRanksMatchOneRankForwardAndBackward) {
  expectDispatchMatchesOneRank(kWrittenBackward, kSpreadRoutes);
}

TEST(ExpertDispatchPlanTest, ARankThatReceivesNoRows) {
  expectDispatchMatchesOneRank(kWrittenBackward, kRoutesToRankZero);
}

TEST(ExpertDispatchPlanTest, TheRewrittenForwardDifferentiatedMatchesOneRank) {
  expectDispatchMatchesOneRank(kDifferentiatedForward, kSpreadRoutes);
  expectDispatchMatchesOneRank(kDifferentiatedForward, kRoutesToRankZero);
}

}  // namespace
}  // namespace dgemma
