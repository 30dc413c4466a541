// dg-shard-propagate's policy (PropagationStrategy.h): which operands keep pending sums, which offer
// wins a factor, and the shardings an op ends up with.
#include "compiler/Transforms/PropagationStrategy.h"

#include <gtest/gtest.h>

#include "dialects/dg/IR/DgDialect.h"
#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/MLIRContext.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

// Shardings as the IR writes them, one string for a list.
std::string printed(ArrayRef<ShardingAttr> shardings) {
  std::string text;
  llvm::raw_string_ostream stream(text);
  llvm::interleaveComma(shardings, stream, [&](ShardingAttr sharding) { stream << sharding; });
  return text;
}

using Keeps = SmallVector<bool>;

class PropagationStrategyTest : public ::testing::Test {
 protected:
  PropagationStrategyTest() { context_.loadDialect<DgDialect>(); }
  ShardingRuleAttr rule(StringRef text) { return cast<ShardingRuleAttr>(parseAttribute(text, &context_)); }
  ShardingAttr sharding(StringRef text) { return cast<ShardingAttr>(parseAttribute(text, &context_)); }

  MLIRContext context_;
  Mesh mesh_{{{"dp", 2, AxisRole::Data}, {"ep", 4, AxisRole::Expert}, {"tp", 2, AxisRole::Tensor}}};
};

TEST_F(PropagationStrategyTest, PendingSumsPassOnlyThroughOperandsTheOpIsLinearIn) {
  ShardingAttr whole = sharding("#dg.sharding<[[]]>");
  ShardingAttr summed = sharding("#dg.sharding<[[]], partial = [tp]>");
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::AllAlike, {whole, summed}), (Keeps{true, true}));
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::AllAlike, {whole, whole}), (Keeps{false, false}));
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::AtMostOne, {whole, summed}), (Keeps{false, true}));
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::AtMostOne, {summed, summed}), (Keeps{false, false}));
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::First, {summed, summed}), (Keeps{true, false}));
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::First, {whole, summed}), (Keeps{false, false}));
  EXPECT_EQ(operandsKeepingPendingSums(LinearOperands::None, {summed}), (Keeps{false}));
}

TEST_F(PropagationStrategyTest, WeightsOfferFirstThenTheMostSplitOperands) {
  ShardingAttr whole = sharding("#dg.sharding<[[], []]>");
  ShardingAttr once = sharding("#dg.sharding<[[dp], []]>");
  ShardingAttr twice = sharding("#dg.sharding<[[dp], [tp]]>");
  EXPECT_EQ(offerPriority({whole, once, twice, whole}, {false, false, false, true}),
            (SmallVector<unsigned>{3, 2, 1, 0}));
  EXPECT_EQ(offerPriority({once, whole, once}, {false, false, false}), (SmallVector<unsigned>{0, 2, 1}));
}

TEST_F(PropagationStrategyTest, TheFirstOfferForAFactorWins) {
  // A column GEMM whose input is split on the sequence: the weight's split of k takes tp first, so
  // the sequence factor j stays whole (the input is gathered).
  ShardingRuleAttr column =
      rule("#dg.sharding_rule<([i, j, l], [k, l]) -> ([i, j, k]) {i=2, j=4, k=6, l=8} reduction={l}>");
  ShardingAttr sequenceSplit = sharding("#dg.sharding<[[], [tp], []]>");
  ShardingAttr columnSplit = sharding("#dg.sharding<[[tp], []]>");
  EXPECT_EQ(pickFactorSplits(mesh_, column, {sequenceSplit, columnSplit}, {1, 0}), (FactorAxes{{}, {}, {"tp"}, {}}));
  // In the other order the sequence split wins and the weight is gathered.
  EXPECT_EQ(pickFactorSplits(mesh_, column, {sequenceSplit, columnSplit}, {0, 1}), (FactorAxes{{}, {"tp"}, {}, {}}));
}

TEST_F(PropagationStrategyTest, AnAxisAnotherFactorTookEndsASplit) {
  // Tokens split over {dp, ep} meet experts split over ep: the tokens keep dp only.
  ShardingRuleAttr experts = rule("#dg.sharding_rule<([i, j], [k, j]) -> ([i, k]) {i=16, j=8, k=4} reduction={j}>");
  ShardingAttr tokens = sharding("#dg.sharding<[[dp, ep], []]>");
  ShardingAttr expertSplit = sharding("#dg.sharding<[[ep], []]>");
  EXPECT_EQ(pickFactorSplits(mesh_, experts, {tokens, expertSplit}, {1, 0}), (FactorAxes{{"dp"}, {}, {"ep"}}));
}

TEST_F(PropagationStrategyTest, FactorsThatMustStayWholeAreNotSplit) {
  ShardingRuleAttr softmax = rule("#dg.sharding_rule<([i, j]) -> ([i, j]) {i=4, j=8} need_replication={j}>");
  EXPECT_EQ(pickFactorSplits(mesh_, softmax, {sharding("#dg.sharding<[[dp], [tp]]>")}, {0}), (FactorAxes{{"dp"}, {}}));
}

TEST_F(PropagationStrategyTest, ARowParallelProductLeavesASumOverItsContraction) {
  ShardingRuleAttr row = rule("#dg.sharding_rule<([i, l], [k, l]) -> ([i, k]) {i=4, k=6, l=8} reduction={l}>");
  ShardingAttr features = sharding("#dg.sharding<[[], [tp]]>");
  OpShardings shardings = shardThroughRule(mesh_, row, {features, features}, {false, false}, {false, true});
  EXPECT_EQ(printed(shardings.operands), "#dg.sharding<[[], [tp]]>, #dg.sharding<[[], [tp]]>");
  EXPECT_EQ(printed(shardings.results), "#dg.sharding<[[], []], partial = [tp]>");
}

TEST_F(PropagationStrategyTest, KeptSumsPassOnUnlessAFactorIsSplitOverTheirAxis) {
  ShardingRuleAttr add = rule("#dg.sharding_rule<([i, j], [i, j]) -> ([i, j]) {i=4, j=8}>");
  ShardingAttr summed = sharding("#dg.sharding<[[], []], partial = [tp]>");
  ShardingAttr whole = sharding("#dg.sharding<[[], []]>");
  OpShardings passed = shardThroughRule(mesh_, add, {summed, whole}, {true, true}, {false, false});
  EXPECT_EQ(printed(passed.operands), "#dg.sharding<[[], []], partial = [tp]>, #dg.sharding<[[], []], partial = [tp]>");
  EXPECT_EQ(printed(passed.results), "#dg.sharding<[[], []], partial = [tp]>");
  // The other operand splits j over tp: nothing is partial over tp any more.
  ShardingAttr split = sharding("#dg.sharding<[[], [tp]]>");
  OpShardings taken = shardThroughRule(mesh_, add, {summed, split}, {true, true}, {false, false});
  EXPECT_EQ(printed(taken.operands), "#dg.sharding<[[], [tp]]>, #dg.sharding<[[], [tp]]>");
  EXPECT_EQ(printed(taken.results), "#dg.sharding<[[], [tp]]>");
}

TEST_F(PropagationStrategyTest, SplitsNoTensorCanExpressAreDropped) {
  // A [batch, sequence] -> tokens reshape: a sequence split alone cannot be a token split.
  ShardingRuleAttr reshape = rule("#dg.sharding_rule<([i, j]) -> ([(i j)]) {i=2, j=8}>");
  OpShardings shardings = shardThroughRule(mesh_, reshape, {sharding("#dg.sharding<[[], [tp]]>")}, {false}, {false});
  EXPECT_EQ(printed(shardings.operands), "#dg.sharding<[[], []]>");
  EXPECT_EQ(printed(shardings.results), "#dg.sharding<[[]]>");
}

}  // namespace
