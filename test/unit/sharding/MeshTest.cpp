// The layouts' base axes and groups, the #dg.mesh attribute, and the block a rank holds under a
// sharding.
#include <gtest/gtest.h>

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgMesh.h"
#include "llvm/ADT/StringMap.h"
#include "mlir/AsmParser/AsmParser.h"
#include "mlir/IR/MLIRContext.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

using Axes = SmallVector<Mesh::Axis>;

std::string printed(Attribute attribute) {
  std::string text;
  llvm::raw_string_ostream(text) << attribute;
  return text;
}
constexpr AxisRole kData = AxisRole::Data, kExpert = AxisRole::Expert, kTensor = AxisRole::Tensor;
using Names = SmallVector<std::string>;

TEST(LayoutGroups, TheSeedRecipeIsOneExpertAxis) {
  auto groups = layoutGroups(/*tp=*/1, /*dp=*/8, /*ep=*/8);
  ASSERT_TRUE(groups);
  EXPECT_EQ(groups->axes, (Axes{{"ep", 8, kExpert}}));
  EXPECT_EQ(groups->data, (Names{"ep"}));
  EXPECT_EQ(groups->expert, (Names{"ep"}));
  EXPECT_TRUE(groups->tensor.empty());
  EXPECT_TRUE(groups->expertData.empty());
}

TEST(LayoutGroups, ExpertGroupsAreConsecutiveRanksAcrossTensorParallelism) {
  // TP2 DP2 EP2: the EP groups {0,1}, {2,3} are the TP groups; expert DP is dense DP.
  auto small = layoutGroups(2, 2, 2);
  ASSERT_TRUE(small);
  EXPECT_EQ(small->axes, (Axes{{"dp", 2, kData}, {"tp", 2, kTensor}}));
  EXPECT_EQ(small->data, (Names{"dp"}));
  EXPECT_EQ(small->tensor, (Names{"tp"}));
  EXPECT_EQ(small->expert, (Names{"tp"}));
  EXPECT_EQ(small->expertData, (Names{"dp"}));
  // TP2 DP4 EP4: EP = {ep, tp} (ranks 0-3 and 4-7), dense DP = {dp, ep}.
  auto large = layoutGroups(2, 4, 4);
  ASSERT_TRUE(large);
  EXPECT_EQ(large->axes, (Axes{{"dp", 2, kData}, {"ep", 2, kExpert}, {"tp", 2, kTensor}}));
  EXPECT_EQ(large->data, (Names{"dp", "ep"}));
  EXPECT_EQ(large->expert, (Names{"ep", "tp"}));
  EXPECT_EQ(large->expertData, (Names{"dp"}));
}

TEST(LayoutGroups, ContextParallelismIsAnAxisBetweenExpertsAndTensor) {
  // CP2 x TP2 x DP4, EP4: TP innermost, then CP (Megatron's tp-cp-ep-dp); the context group is its
  // own, outside the inputs' data group.
  auto groups = layoutGroups(2, 4, 4, /*cp=*/2);
  ASSERT_TRUE(groups);
  EXPECT_EQ(groups->axes,
            (Axes{{"dp", 2, kData}, {"ep", 2, kExpert}, {"cp", 2, AxisRole::Context}, {"tp", 2, kTensor}}));
  EXPECT_EQ(groups->data, (Names{"dp", "ep"}));
  EXPECT_EQ(groups->expert, (Names{"ep", "tp"}));
  EXPECT_EQ(groups->context, (Names{"cp"}));
  EXPECT_TRUE(layoutGroups(1, 1, 1, 1)->context.empty());
  EXPECT_FALSE(layoutGroups(1, 1, 1, 0));
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

// TP beyond the KV heads (docs/parallelism.md): a weight of 2 shared heads at TP 8 splits over `tp`
// (2) and is replicated over `tp1` (4); heads at or above TP add no cut.
TEST(LayoutGroups, SharedHeadsBelowTensorParallelCutTheTensorGroup) {
  auto groups = layoutGroups(/*tp=*/8, /*dp=*/1, /*ep=*/1, /*cp=*/1, /*sharedHeadSplits=*/{8, 2, 2, 16});
  ASSERT_TRUE(groups);
  EXPECT_EQ(groups->axes, (Axes{{"tp", 2, kTensor}, {"tp1", 4, kTensor}}));
  EXPECT_EQ(groups->tensor, (Names{"tp", "tp1"}));
  EXPECT_EQ(groups->expertData, (Names{"tp", "tp1"}));
  // Rank 5 is (tp 1, tp1 1): it holds KV head 1 of 2, the head of query heads [10, 12) of 16.
  EXPECT_EQ(Mesh(groups->axes).coordinates(5), (SmallVector<int64_t>{1, 1}));
  // Two counts below TP: three axes, outer to inner. With EP, the expert group takes all of them.
  auto nested = layoutGroups(8, 8, 8, 1, {2, 4});
  ASSERT_TRUE(nested);
  EXPECT_EQ(nested->axes, (Axes{{"dp", 8, kData}, {"tp", 2, kTensor}, {"tp1", 2, kTensor}, {"tp2", 2, kTensor}}));
  EXPECT_EQ(nested->expert, (Names{"tp", "tp1", "tp2"}));
  // One head: replicated on every TP rank, so the single axis is whole-group as before.
  auto single = layoutGroups(4, 1, 1, 1, {1});
  ASSERT_TRUE(single);
  EXPECT_EQ(single->axes, (Axes{{"tp", 4, kTensor}}));
  // Counts whose blocks do not nest.
  EXPECT_FALSE(layoutGroups(6, 1, 1, 1, {2, 3}));
  // With context parallelism the tensor axes stay innermost, after cp: CP 2 x TP 4 on 2 KV heads.
  auto context = layoutGroups(4, 1, 1, 2, {2});
  ASSERT_TRUE(context);
  EXPECT_EQ(context->axes, (Axes{{"cp", 2, AxisRole::Context}, {"tp", 2, kTensor}, {"tp1", 2, kTensor}}));
  EXPECT_EQ(context->tensor, (Names{"tp", "tp1"}));
  EXPECT_EQ(context->context, (Names{"cp"}));
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
  module->setAttr(kMeshAttr, meshAttr(&context, {{"dp", 2, kData}, {"ep", 2, kExpert}, {"tp", 2, kTensor}}));
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

TEST(Mesh, FindsAxesByRoleInMeshOrder) {
  Mesh mesh({{"tp", 2, kTensor}, {"ep", 2, kExpert}, {"dp", 2, kData}, {"pp", 1, kData}});
  EXPECT_EQ(mesh.axesWithRole(kTensor), (SmallVector<StringRef>{"tp"}));
  EXPECT_EQ(mesh.axesWithRole(kData), (SmallVector<StringRef>{"dp", "pp"}));
  EXPECT_EQ(mesh.axesWithAnyRole({kData, kExpert}), (SmallVector<StringRef>{"ep", "dp", "pp"}));
  EXPECT_TRUE(mesh.axesWithRole(AxisRole::Context).empty());
}

TEST(MeshAttr, PrintsAndParsesItsAxesInOrder) {
  MLIRContext context;
  context.loadDialect<DgDialect>();
  MeshAttr mesh = meshAttr(&context, {{"tp", 2, kTensor}, {"dp", 4, kData}});
  EXPECT_EQ(printed(mesh), "#dg.mesh<[tp = 2 (tensor), dp = 4 (data)]>");
  EXPECT_EQ(parseAttribute(printed(mesh), &context), mesh);
}

TEST(MeshAttr, RejectsRepeatedAxesSizesBelowOneAndUnknownRoles) {
  MLIRContext context;
  context.loadDialect<DgDialect>();
  context.getDiagEngine().registerHandler([](Diagnostic&) { return success(); });
  EXPECT_FALSE(parseAttribute("#dg.mesh<[tp = 2 (tensor), tp = 2 (tensor)]>", &context));
  EXPECT_FALSE(parseAttribute("#dg.mesh<[tp = 0 (tensor)]>", &context));
  EXPECT_FALSE(parseAttribute("#dg.mesh<[tp = 2 (pipeline)]>", &context));
}

// Renaming the axes of a layout (here into names whose alphabetical order is not the mesh's) moves
// no rank: every rank keeps its coordinates and its block of every group's split.
TEST(Mesh, RenamingAxesChangesNoRankOrder) {
  MLIRContext context;
  context.loadDialect<DgDialect>();
  std::optional<LayoutGroups> groups = layoutGroups(/*tp=*/2, /*dp=*/4, /*ep=*/4);
  ASSERT_TRUE(groups);
  const llvm::StringMap<std::string> newNames = {{"dp", "replica"}, {"ep", "experts"}, {"tp", "model"}};
  Axes renamedAxes;
  for (const Mesh::Axis& axis : groups->axes) renamedAxes.push_back({newNames.lookup(axis.name), axis.size, axis.role});
  auto meshOf = [&](const Axes& axes) {
    auto module = ModuleOp::create(UnknownLoc::get(&context));
    module->setAttr(kMeshAttr, meshAttr(&context, axes));
    Mesh mesh = Mesh::of(module);
    module->erase();
    return mesh;
  };
  const Mesh original = meshOf(groups->axes), renamed = meshOf(renamedAxes);
  auto names = [](ArrayRef<std::string> group) { return SmallVector<StringRef>(group.begin(), group.end()); };
  auto renamedNames = [&](ArrayRef<std::string> group) {
    SmallVector<StringRef> axes;
    for (const std::string& name : group) axes.push_back(newNames.find(name)->getValue());
    return axes;
  };
  // Dim 0 split over one group, dim 2 over another.
  const SmallVector<std::pair<SmallVector<std::string>, SmallVector<std::string>>> splits = {
      {groups->data, groups->tensor}, {groups->expert, {}}, {groups->expertData, groups->expert}};
  const SmallVector<int64_t> shape{8, 3, 16};
  ASSERT_EQ(renamed.worldSize(), original.worldSize());
  for (int64_t rank = 0; rank < original.worldSize(); ++rank) {
    EXPECT_EQ(renamed.coordinates(rank), original.coordinates(rank)) << "rank " << rank;
    for (const auto& [dim0, dim2] : splits) {
      auto before = ShardingAttr::get(&context, {names(dim0), {}, names(dim2)});
      auto after = ShardingAttr::get(&context, {renamedNames(dim0), {}, renamedNames(dim2)});
      EXPECT_EQ(renamed.shardOffset(after, shape, rank), original.shardOffset(before, shape, rank))
          << "rank " << rank << ", " << printed(after) << " against " << printed(before);
    }
  }
}

}  // namespace
