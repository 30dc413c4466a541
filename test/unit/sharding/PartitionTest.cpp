// dg-shard-partition, numerically: hand-annotated modules are partitioned for every rank of their
// mesh, lowered with that rank (lowerToPlan), and run on Gloo ranks in threads, each rank fed its box
// of every input and parameter. Every rank's box of every output, and of every parameter an assign
// wrote (summed over the ranks when it is a pending sum), must match the module run unpartitioned
// on one rank.
#include <gtest/gtest.h>
#include <gloo/rendezvous/prefix_store.h>

#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgMesh.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "mlir/Pass/PassManager.h"
#include "runtime/comm/GlooCommunicator.h"
#include "runtime/core/ShardBoxes.h"
#include "runtime/exec/Executor.h"
#include "runtime/kernel_api/Backend.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

// A column-parallel then a row-parallel matmul (Megatron's MLP): the hidden activations are split
// on their features, the second product is a pending sum over tp that its consumer all-reduces.
constexpr const char* kTensorParallelMlp = R"mlir(
#whole = #dg.sharding<[[], []]>
#column = #dg.sharding<[[tp], []]>
#row = #dg.sharding<[[], [tp]]>
#features = #dg.sharding<[[], [tp]]>
#partial = #dg.sharding<[[], []], partial = [tp]>
module attributes {dg.mesh = #dg.mesh<[tp = 2 (tensor)]>} {
func.func @forward() attributes {dg.entry = "forward"} {
  %x = dg.input "x" {dg.shardings = [#whole]} : tensor<4x8xf32>
  %w1 = dg.param "w1" {dg.shardings = [#column]} : tensor<6x8xf32>
  %w2 = dg.param "w2" {dg.shardings = [#row]} : tensor<8x6xf32>
  %h = dg.matmul %x, %w1 {transpose_b = true, dg.shardings = [#features], dg.operand_shardings = [#whole, #column]} : tensor<4x8xf32>, tensor<6x8xf32> -> tensor<4x6xf32>
  %a = dg.tanh %h {dg.shardings = [#features], dg.operand_shardings = [#features]} : tensor<4x6xf32>
  %y = dg.matmul %a, %w2 {transpose_b = true, dg.shardings = [#partial], dg.operand_shardings = [#features, #row]} : tensor<4x6xf32>, tensor<8x6xf32> -> tensor<4x8xf32>
  %z = dg.exp %y {dg.shardings = [#whole], dg.operand_shardings = [#whole]} : tensor<4x8xf32>
  dg.output "z", %z {dg.operand_shardings = [#whole]} : tensor<4x8xf32>
  dg.output "a", %a {dg.operand_shardings = [#features]} : tensor<4x6xf32>
  return
}
}
)mlir";

// A data-parallel step: the batch is split over dp, the loss (a mean over the batch) and the weight
// gradient are pending sums over dp; the gradient accumulates into a buffer that stays a pending
// sum, and is handed out all-reduced.
constexpr const char* kDataParallelGradient = R"mlir(
#batch = #dg.sharding<[[dp], []]>
#whole = #dg.sharding<[[], []]>
#partial = #dg.sharding<[[], []], partial = [dp]>
#scalar = #dg.sharding<[]>
#partial_scalar = #dg.sharding<[], partial = [dp]>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
func.func @train_step() attributes {dg.entry = "train_step"} {
  %x = dg.input "x" {dg.shardings = [#batch]} : tensor<4x3xf32>
  %w = dg.param "w" {dg.shardings = [#whole]} : tensor<3x2xf32>
  %acc = dg.param "acc" {init = {kind = "zeros"}, trainable = false, dg.shardings = [#partial]} : tensor<3x2xf32>
  %y = dg.matmul %x, %w {dg.shardings = [#batch], dg.operand_shardings = [#batch, #whole]} : tensor<4x3xf32>, tensor<3x2xf32> -> tensor<4x2xf32>
  %sq = dg.mul %y, %y {dg.shardings = [#batch], dg.operand_shardings = [#batch, #batch]} : tensor<4x2xf32>, tensor<4x2xf32> -> tensor<4x2xf32>
  %loss = dg.reduce_mean %sq dims = [0, 1] {dg.shardings = [#partial_scalar], dg.operand_shardings = [#batch]} : tensor<4x2xf32> -> tensor<f32>
  %scale = dg.fill 0.25 {dg.shardings = [#scalar]} : tensor<f32>
  %dy = dg.mul %y, %scale {dg.shardings = [#batch], dg.operand_shardings = [#batch, #scalar]} : tensor<4x2xf32>, tensor<f32> -> tensor<4x2xf32>
  %gw = dg.matmul %x, %dy {transpose_a = true, dg.shardings = [#partial], dg.operand_shardings = [#batch, #batch]} : tensor<4x3xf32>, tensor<4x2xf32> -> tensor<3x2xf32>
  %sum = dg.add %acc, %gw {dg.shardings = [#partial], dg.operand_shardings = [#partial, #partial]} : tensor<3x2xf32>, tensor<3x2xf32> -> tensor<3x2xf32>
  dg.assign %sum to %acc {dg.operand_shardings = [#partial, #partial]} : tensor<3x2xf32>
  dg.output "loss", %loss {dg.operand_shardings = [#scalar]} : tensor<f32>
  dg.output "grad/w", %gw {dg.operand_shardings = [#whole]} : tensor<3x2xf32>
  dg.output "y", %y {dg.operand_shardings = [#batch]} : tensor<4x2xf32>
  return
}
}
)mlir";

// Both at once over two axes: the batch over dp, the MLP's features over tp. The loss is a pending
// sum over both axes (a chain of two all-reduces); the output gathers the batch over dp.
constexpr const char* kTwoAxes = R"mlir(
#batch = #dg.sharding<[[dp], []]>
#whole = #dg.sharding<[[], []]>
#column = #dg.sharding<[[tp], []]>
#row = #dg.sharding<[[], [tp]]>
#batch_features = #dg.sharding<[[dp], [tp]]>
#batch_partial = #dg.sharding<[[dp], []], partial = [tp]>
#scalar = #dg.sharding<[]>
#partial_scalar = #dg.sharding<[], partial = [dp, tp]>
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data), tp = 2 (tensor)]>} {
func.func @forward() attributes {dg.entry = "forward"} {
  %x = dg.input "x" {dg.shardings = [#batch]} : tensor<4x8xf32>
  %w1 = dg.param "w1" {dg.shardings = [#column]} : tensor<6x8xf32>
  %w2 = dg.param "w2" {dg.shardings = [#row]} : tensor<8x6xf32>
  %h = dg.matmul %x, %w1 {transpose_b = true, dg.shardings = [#batch_features], dg.operand_shardings = [#batch, #column]} : tensor<4x8xf32>, tensor<6x8xf32> -> tensor<4x6xf32>
  %a = dg.tanh %h {dg.shardings = [#batch_features], dg.operand_shardings = [#batch_features]} : tensor<4x6xf32>
  %y = dg.matmul %a, %w2 {transpose_b = true, dg.shardings = [#batch_partial], dg.operand_shardings = [#batch_features, #row]} : tensor<4x6xf32>, tensor<8x6xf32> -> tensor<4x8xf32>
  %s = dg.reduce_sum %y dims = [0, 1] {dg.shardings = [#partial_scalar], dg.operand_shardings = [#batch_partial]} : tensor<4x8xf32> -> tensor<f32>
  dg.output "y", %y {dg.operand_shardings = [#whole]} : tensor<4x8xf32>
  dg.output "sum", %s {dg.operand_shardings = [#scalar]} : tensor<f32>
  return
}
}
)mlir";

// Distinct smooth values.
HostTensor drawn(const std::vector<int64_t>& shape, int64_t salt) {
  HostTensor tensor(DType::F32, shape);
  for (int64_t i = 0; i < tensor.numElements(); ++i)
    tensor.as<float>()[i] = static_cast<float>(0.5 * std::sin(1.0 + 0.37 * double(i) + 1.3 * double(salt)));
  return tensor;
}

ShardBox boxOf(const std::vector<int64_t>& globalShape, const std::vector<int64_t>& offset,
               const std::vector<int64_t>& shape) {
  return globalShape.empty() ? wholeBox(shape) : ShardBox{offset, shape};
}

// The elements of `box` of the global tensor `whole`.
HostTensor cut(const HostTensor& whole, const ShardBox& box) {
  HostTensor part(whole.dtype, box.shape);
  copyRegion(whole.data.data(), wholeBox(whole.shape), part.data.data(), box, box, dtypeSize(whole.dtype));
  return part;
}

mlir::OwningOpRef<mlir::ModuleOp> parse(const char* program, mlir::MLIRContext& context) {
  context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
  return mlir::parseSourceString<mlir::ModuleOp>(program, &context);
}

// The unpartitioned module: the same program without its shardings, on a mesh of one rank.
Plan lowerWhole(const char* program) {
  mlir::MLIRContext context;
  auto module = parse(program, context);
  EXPECT_TRUE(module);
  (*module)->removeAttr(mlir::dg::kMeshAttr);
  module->walk([](mlir::Operation* op) {
    op->removeAttr(mlir::dg::kShardingsAttr);
    op->removeAttr(mlir::dg::kOperandShardingsAttr);
  });
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, mlir::dg::PipelineOptions{})));
  auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
  EXPECT_TRUE(mlir::succeeded(plan));
  return std::move(*plan);
}

Plan lowerRank(const char* program, int64_t rank) {
  mlir::MLIRContext context;
  auto module = parse(program, context);
  EXPECT_TRUE(module);
  mlir::PassManager passes(&context);
  passes.addPass(mlir::dg::createDgShardPartition(mlir::dg::DgShardPartitionOptions{rank}));
  EXPECT_TRUE(mlir::succeeded(passes.run(*module)));
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, mlir::dg::PipelineOptions{})));
  mlir::dg::PlanLoweringOptions options;
  options.rank = rank;
  auto plan = mlir::dg::lowerToPlan(*module, options);
  EXPECT_TRUE(mlir::succeeded(plan));
  return std::move(*plan);
}

std::map<std::string, HostTensor> globalParameters(const Plan& plan) {
  std::map<std::string, HostTensor> parameters;
  int64_t salt = 100;
  for (const Parameter& parameter : plan.parameters)
    parameters[parameter.name] = parameter.trainable ? drawn(parameter.globalShape, ++salt)
                                                     : HostTensor(DType::F32, parameter.globalShape);
  return parameters;
}

// What one rank (or the single-rank reference) hands out and leaves in its parameters.
struct RankResult {
  std::map<std::string, HostTensor> outputs;
  std::map<std::string, HostTensor> parameters;
};

RankResult runPlan(const Plan& plan, CommunicatorSet& communicators, const std::map<std::string, HostTensor>& inputs,
                   const std::map<std::string, HostTensor>& parameters) {
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  Executor executor(plan, *backend, communicators, "partition.dgplan");
  for (const Parameter& parameter : plan.parameters)
    executor.setParameter(parameter.name, cut(parameters.at(parameter.name),
                                              ShardBox{parameter.shardOffset, parameter.shardShape}));
  const EntryPoint& entry = plan.entryPoints.at(0);
  std::map<std::string, HostTensor> fed;
  for (const NamedBuffer& input : entry.inputs)
    fed[input.name] = cut(inputs.at(input.name),
                          boxOf(input.globalShape, input.shardOffset, plan.buffers.at(input.buffer).shape));
  RankResult result;
  result.outputs = executor.run(entry, fed);
  for (const Parameter& parameter : plan.parameters) result.parameters[parameter.name] = executor.parameter(parameter.name);
  return result;
}

// The communicator of each mesh axis: the ranks that differ from this one only along it.
CommunicatorSet axisCommunicators(const Plan& plan, const std::shared_ptr<gloo::rendezvous::Store>& store) {
  CommunicatorSet communicators;
  for (size_t axis = 0; axis < plan.mesh.size(); ++axis) {
    std::string group = plan.mesh[axis].name;
    for (size_t other = 0; other < plan.mesh.size(); ++other)
      if (other != axis) group.append("/").append(std::to_string(plan.mesh[other].coord));
    auto groupStore = std::make_shared<gloo::rendezvous::PrefixStore>(group, *store);
    communicators.add(plan.mesh[axis].name, createGlooCommunicator(groupStore, plan.mesh[axis].coord,
                                                                   plan.mesh[axis].size, std::chrono::seconds(10)));
  }
  return communicators;
}

void expectNear(const HostTensor& actual, const HostTensor& expected, const std::string& what) {
  ASSERT_EQ(actual.shape, expected.shape) << what;
  for (int64_t i = 0; i < expected.numElements(); ++i) {
    float want = expected.as<float>()[i];
    EXPECT_NEAR(actual.as<float>()[i], want, 1e-6 * std::max(1.0f, std::abs(want))) << what << " element " << i;
  }
}

// Partitions `program` for every rank, runs the ranks and the unpartitioned reference on the same
// global inputs and parameters, and compares. `pendingSums` names the parameters that hold a
// pending sum over some axes (a gradient buffer).
void expectPartitionMatchesOneRank(const char* program, const std::map<std::string, std::vector<int64_t>>& inputShapes,
                                   const std::set<std::string>& pendingSums = {}) {
  const Plan reference = lowerWhole(program);
  std::map<std::string, HostTensor> inputs;
  int64_t salt = 0;
  for (const auto& [name, shape] : inputShapes) inputs[name] = drawn(shape, ++salt);
  const std::map<std::string, HostTensor> parameters = globalParameters(reference);
  CommunicatorSet none;
  const RankResult expected = runPlan(reference, none, inputs, parameters);

  mlir::MLIRContext meshContext;
  auto meshModule = parse(program, meshContext);
  ASSERT_TRUE(meshModule);
  const int64_t ranks = mlir::dg::Mesh::of(*meshModule).worldSize();
  std::vector<Plan> plans;
  for (int64_t rank = 0; rank < ranks; ++rank) plans.push_back(lowerRank(program, rank));
  std::vector<RankResult> results(ranks);
  const std::vector<std::string> failures =
      test::runOnRanks(ranks, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        CommunicatorSet communicators = axisCommunicators(plans[rank], store);
        results[rank] = runPlan(plans[rank], communicators, inputs, parameters);
      });
  for (int64_t rank = 0; rank < ranks; ++rank) ASSERT_EQ(failures[rank], "") << "rank " << rank;

  for (int64_t rank = 0; rank < ranks; ++rank) {
    const EntryPoint& entry = plans[rank].entryPoints.at(0);
    for (const NamedBuffer& output : entry.outputs) {
      const HostTensor& whole = expected.outputs.at(output.name);
      ShardBox box = boxOf(output.globalShape, output.shardOffset, plans[rank].buffers.at(output.buffer).shape);
      expectNear(results[rank].outputs.at(output.name), cut(whole, box), "rank " + std::to_string(rank) + " " + output.name);
    }
  }
  // Parameters: each rank's box; a pending sum is summed over the ranks holding the same box (the
  // reference holds the sum).
  for (const Parameter& parameter : plans[0].parameters) {
    const bool pendingSum = pendingSums.count(parameter.name) > 0;
    std::map<std::vector<int64_t>, HostTensor> sums;  // by the box's offset
    for (int64_t rank = 0; rank < ranks; ++rank) {
      const Parameter* mine = nullptr;
      for (const Parameter& candidate : plans[rank].parameters) mine = candidate.name == parameter.name ? &candidate : mine;
      ASSERT_NE(mine, nullptr);
      const HostTensor& local = results[rank].parameters.at(parameter.name);
      const std::string what = "rank " + std::to_string(rank) + " parameter " + parameter.name;
      if (!pendingSum) {
        expectNear(local, cut(expected.parameters.at(parameter.name), ShardBox{mine->shardOffset, mine->shardShape}), what);
        continue;
      }
      auto [sum, fresh] = sums.try_emplace(mine->shardOffset, local);
      if (!fresh)
        for (int64_t i = 0; i < local.numElements(); ++i) sum->second.as<float>()[i] += local.as<float>()[i];
    }
    for (const auto& [offset, sum] : sums)
      expectNear(sum, cut(expected.parameters.at(parameter.name), ShardBox{offset, sum.shape}),
                 "pending sum " + parameter.name);
  }
}

TEST(PartitionTest, ColumnThenRowParallelMlpMatchesOneRank) {
  expectPartitionMatchesOneRank(kTensorParallelMlp, {{"x", {4, 8}}});
}

TEST(PartitionTest, DataParallelBatchWithPendingWeightGradientMatchesOneRank) {
  expectPartitionMatchesOneRank(kDataParallelGradient, {{"x", {4, 3}}}, {"acc"});
}

TEST(PartitionTest, BatchAndFeaturesOverTwoAxesMatchOneRank) {
  expectPartitionMatchesOneRank(kTwoAxes, {{"x", {4, 8}}});
}

// Each rank's plan records its boxes: the column-split weight's rows, the row-split weight's
// columns, the features of the split output.
TEST(PartitionTest, PlansRecordEachRanksBoxes) {
  const Plan plan = lowerRank(kTensorParallelMlp, 1);
  EXPECT_EQ(plan.worldSize, 2);
  std::map<std::string, const Parameter*> parameters;
  for (const Parameter& parameter : plan.parameters) parameters[parameter.name] = &parameter;
  EXPECT_EQ(parameters.at("w1")->globalShape, (std::vector<int64_t>{6, 8}));
  EXPECT_EQ(parameters.at("w1")->shardOffset, (std::vector<int64_t>{3, 0}));
  EXPECT_EQ(parameters.at("w1")->shardShape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(parameters.at("w2")->shardOffset, (std::vector<int64_t>{0, 3}));
  const EntryPoint& entry = plan.entryPoints.at(0);
  EXPECT_TRUE(entry.inputs.at(0).isWhole());
  for (const NamedBuffer& output : entry.outputs) {
    if (output.name == "z") {
      EXPECT_TRUE(output.isWhole());
      continue;
    }
    EXPECT_EQ(output.globalShape, (std::vector<int64_t>{4, 6}));
    EXPECT_EQ(output.shardOffset, (std::vector<int64_t>{0, 3}));
  }
}

}  // namespace
}  // namespace dgemma
