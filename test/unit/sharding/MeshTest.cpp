// The layouts' base axes and groups, and the block a rank holds under a sharding.
#include <gtest/gtest.h>

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgMesh.h"
#include "mlir/IR/MLIRContext.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

using Axes = SmallVector<std::pair<std::string, int64_t>>;
using Names = SmallVector<std::string>;

TEST(LayoutGroups, TheSeedRecipeIsOneExpertAxis) {
  auto groups = layoutGroups(/*tp=*/1, /*dp=*/8, /*ep=*/8);
  ASSERT_TRUE(groups);
  EXPECT_EQ(groups->axes, (Axes{{"ep", 8}}));
  EXPECT_EQ(groups->data, (Names{"ep"}));
  EXPECT_EQ(groups->expert, (Names{"ep"}));
  EXPECT_TRUE(groups->tensor.empty());
  EXPECT_TRUE(groups->expertData.empty());
}

TEST(LayoutGroups, ExpertGroupsAreConsecutiveRanksAcrossTensorParallelism) {
  // TP2 DP2 EP2: the EP groups {0,1}, {2,3} are the TP groups; expert DP is dense DP.
  auto small = layoutGroups(2, 2, 2);
  ASSERT_TRUE(small);
  EXPECT_EQ(small->axes, (Axes{{"dp", 2}, {"tp", 2}}));
  EXPECT_EQ(small->data, (Names{"dp"}));
  EXPECT_EQ(small->tensor, (Names{"tp"}));
  EXPECT_EQ(small->expert, (Names{"tp"}));
  EXPECT_EQ(small->expertData, (Names{"dp"}));
  // TP2 DP4 EP4: EP = {ep, tp} (ranks 0-3 and 4-7), dense DP = {dp, ep}.
  auto large = layoutGroups(2, 4, 4);
  ASSERT_TRUE(large);
  EXPECT_EQ(large->axes, (Axes{{"dp", 2}, {"ep", 2}, {"tp", 2}}));
  EXPECT_EQ(large->data, (Names{"dp", "ep"}));
  EXPECT_EQ(large->expert, (Names{"ep", "tp"}));
  EXPECT_EQ(large->expertData, (Names{"dp"}));
}

TEST(LayoutGroups, WithoutExpertParallelismExpertsReduceOverEveryRank) {
  auto groups = layoutGroups(2, 2, 1);
  ASSERT_TRUE(groups);
  EXPECT_TRUE(groups->expert.empty());
  EXPECT_EQ(groups->expertData, (Names{"dp", "tp"}));
  auto single = layoutGroups(1, 1, 1);
  ASSERT_TRUE(single);
  EXPECT_TRUE(single->axes.empty());
}

TEST(LayoutGroups, RejectsImpossibleLayouts) {
  EXPECT_FALSE(layoutGroups(1, 2, 4));  // EP must divide DP
  EXPECT_FALSE(layoutGroups(2, 3, 3));  // TP must divide EP
  EXPECT_FALSE(layoutGroups(0, 2, 1));
}

TEST(Mesh, RanksHoldTheBlockTheirCoordinatesSelect) {
  MLIRContext context;
  context.loadDialect<DgDialect>();
  auto module = ModuleOp::create(UnknownLoc::get(&context));
  module->setAttr(kMeshAttr, meshAttr(&context, {{"dp", 2}, {"ep", 2}, {"tp", 2}}));
  Mesh mesh = Mesh::of(module);
  EXPECT_EQ(mesh.worldSize(), 8);
  EXPECT_EQ(mesh.coordinates(6), (SmallVector<int64_t>{1, 1, 0}));
  auto sharding = ShardingAttr::get(&context, {{"tp"}, {}, {"dp", "ep"}});
  SmallVector<int64_t> shape{4, 3, 8};
  EXPECT_EQ(mesh.localShape(sharding, shape), (SmallVector<int64_t>{2, 3, 2}));
  // Rank 6 = (dp 1, ep 1, tp 0): dim 0 block 0, dim 2 block 1 * 2 + 1 = 3.
  EXPECT_EQ(mesh.shardOffset(sharding, shape, 6), (SmallVector<int64_t>{0, 0, 6}));
  EXPECT_EQ(mesh.shardOffset(sharding, shape, 1), (SmallVector<int64_t>{2, 0, 0}));
  module->erase();
}

}  // namespace
