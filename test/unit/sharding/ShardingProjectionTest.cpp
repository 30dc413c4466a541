// The projections between tensor shardings and a sharding rule's factors (ShardingProjection.h).
#include "compiler/Transforms/ShardingProjection.h"

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

using Names = SmallVector<StringRef>;

class ShardingProjectionTest : public ::testing::Test {
 protected:
  ShardingProjectionTest() { context_.loadDialect<DgDialect>(); }
  ShardingRuleAttr rule(StringRef text) { return cast<ShardingRuleAttr>(parseAttribute(text, &context_)); }

  MLIRContext context_;
  Mesh mesh_{{{"dp", 2, AxisRole::Data}, {"ep", 4, AxisRole::Expert}, {"tp", 2, AxisRole::Tensor}}};
};

TEST_F(ShardingProjectionTest, AxesSplitADimensionsFactorsMajorToMinor) {
  // One dimension [(i j)] of i = 2, j = 8.
  ShardingRuleAttr merged = rule("#dg.sharding_rule<([(i j)]) -> ([i, j]) {i=2, j=8}>");
  auto split = splitDimOverFactors(mesh_, merged, {0, 1}, {"dp", "ep"});
  ASSERT_TRUE(split);
  EXPECT_EQ(*split, (SmallVector<Names>{{"dp"}, {"ep"}}));
  // i takes tp and is complete; j takes nothing more.
  split = splitDimOverFactors(mesh_, merged, {0, 1}, {"tp"});
  ASSERT_TRUE(split);
  EXPECT_EQ(*split, (SmallVector<Names>{{"tp"}, {}}));
  // ep (4) does not divide i (2), and j cannot be split before i is.
  EXPECT_FALSE(splitDimOverFactors(mesh_, merged, {0, 1}, {"ep"}));
  // No axes: no factor is split.
  split = splitDimOverFactors(mesh_, merged, {0, 1}, {});
  ASSERT_TRUE(split);
  EXPECT_EQ(*split, (SmallVector<Names>{{}, {}}));
}

TEST_F(ShardingProjectionTest, AMinorFactorKeepsItsSplitOnlyUnderACompletelySplitMajorOne) {
  // A [batch, sequence] -> tokens reshape: the result's dimension is (i j).
  ShardingRuleAttr reshape = rule("#dg.sharding_rule<([i, j]) -> ([(i j)]) {i=4, j=8}>");
  FactorAxes sequenceOnly = {{}, {"tp"}};
  dropInexpressibleSplits(mesh_, reshape, sequenceOnly);
  EXPECT_EQ(sequenceOnly, (FactorAxes{{}, {}}));
  FactorAxes partOfBatch = {{"dp"}, {"tp"}};  // dp splits i (4) only in two
  dropInexpressibleSplits(mesh_, reshape, partOfBatch);
  EXPECT_EQ(partOfBatch, (FactorAxes{{"dp"}, {}}));
  FactorAxes wholeBatch = {{"dp", "tp"}, {"ep"}};
  dropInexpressibleSplits(mesh_, reshape, wholeBatch);
  EXPECT_EQ(wholeBatch, (FactorAxes{{"dp", "tp"}, {"ep"}}));
}

TEST_F(ShardingProjectionTest, DimensionsTakeTheirFactorsAxesUpToTheFirstUnsplitFactor) {
  ShardingRuleAttr reshape = rule("#dg.sharding_rule<([i, j, k]) -> ([(i j k)]) {i=2, j=4, k=2}>");
  FactorAxes factorAxes = {{"dp"}, {}, {"tp"}};
  EXPECT_EQ(projectToDims(reshape.getOperands()[0], factorAxes), (SmallVector<Names>{{"dp"}, {}, {"tp"}}));
  EXPECT_EQ(projectToDims(reshape.getResults()[0], factorAxes), (SmallVector<Names>{{"dp"}}));
  EXPECT_EQ(splitAxes(factorAxes), (Names{"dp", "tp"}));
}

TEST_F(ShardingProjectionTest, AResultIsPartialOverTheSplitReductionFactorsItLacks) {
  ShardingRuleAttr matmul = rule("#dg.sharding_rule<([i, l], [l, k]) -> ([i, k]) {i=4, k=6, l=8} reduction={l}>");
  FactorAxes rowParallel = {{}, {}, {"tp"}};
  TensorFactorsAttr result = matmul.getResults()[0];
  EXPECT_EQ(missingReductionAxes(matmul, result, rowParallel), (Names{"tp"}));
  EXPECT_TRUE(missingReductionAxes(matmul, matmul.getOperands()[0], rowParallel).empty());
  EXPECT_EQ(printed(shardingOf(mesh_, result, rowParallel, {"tp"})), "#dg.sharding<[[], []], partial = [tp]>");
  // Partial axes come out in the mesh's order.
  FactorAxes columnParallel = {{}, {"tp"}, {}};
  EXPECT_EQ(printed(shardingOf(mesh_, result, columnParallel, {"ep", "dp"})),
            "#dg.sharding<[[], [tp]], partial = [dp, ep]>");
}

}  // namespace
