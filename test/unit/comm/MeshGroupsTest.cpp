// The groups of the base mesh axes for the layouts of docs/parallelism.md ("Meshes"), and the
// communicators connected over them.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <set>

#include "runtime/comm/MeshCommunicators.h"
#include "runtime/comm/MeshGroups.h"
#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

// The mesh as rank `rank`'s plan records it: the axes with that rank's row-major coordinates.
std::vector<MeshAxis> meshOfRank(std::vector<std::pair<std::string, int64_t>> axes, int64_t rank) {
  std::vector<MeshAxis> mesh;
  for (const auto& [name, size] : axes) mesh.push_back({name, size, 0});
  std::vector<int64_t> coordinates = meshCoordinates(mesh, rank);
  for (size_t i = 0; i < mesh.size(); ++i) mesh[i].coord = coordinates[i];
  return mesh;
}

const AxisGroup& groupOf(const std::vector<AxisGroup>& groups, const std::string& axis) {
  for (const AxisGroup& group : groups)
    if (group.axis == axis) return group;
  throw std::runtime_error("no group " + axis);
}

TEST(MeshGroups, Tp1Dp8Ep8IsOneEpAxis) {
  std::vector<AxisGroup> groups = meshAxisGroups(meshOfRank({{"ep", 8}}, 3), 3, "p");
  ASSERT_EQ(groups.size(), 1u);
  EXPECT_EQ(groups[0].ranks, (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(groups[0].position, 3);
}

TEST(MeshGroups, Tp2Dp2Ep2HasTpFastest) {
  // {dp = 2, tp = 2}: rank 1 is (dp 0, tp 1).
  std::vector<AxisGroup> groups = meshAxisGroups(meshOfRank({{"dp", 2}, {"tp", 2}}, 1), 1, "p");
  EXPECT_EQ(groupOf(groups, "tp").ranks, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(groupOf(groups, "tp").position, 1);
  EXPECT_EQ(groupOf(groups, "dp").ranks, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(groupOf(groups, "dp").position, 0);
}

TEST(MeshGroups, Tp1Dp4Ep2HasConsecutiveEpGroups) {
  // {dp = 2, ep = 2}: rank 2 is (dp 1, ep 0).
  std::vector<AxisGroup> groups = meshAxisGroups(meshOfRank({{"dp", 2}, {"ep", 2}}, 2), 2, "p");
  EXPECT_EQ(groupOf(groups, "ep").ranks, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(groupOf(groups, "dp").ranks, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(groupOf(groups, "dp").position, 1);
}

TEST(MeshGroups, ThreeAxesPartitionTheRanksPerAxis) {
  const std::vector<std::pair<std::string, int64_t>> axes = {{"dp", 2}, {"ep", 2}, {"tp", 2}};
  // Rank 5 = (dp 1, ep 0, tp 1).
  std::vector<AxisGroup> groups = meshAxisGroups(meshOfRank(axes, 5), 5, "p");
  EXPECT_EQ(groupOf(groups, "dp").ranks, (std::vector<int64_t>{1, 5}));
  EXPECT_EQ(groupOf(groups, "ep").ranks, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(groupOf(groups, "tp").ranks, (std::vector<int64_t>{4, 5}));
  // Every rank of a group computes the same key, and each axis has world / size distinct groups.
  for (const std::string axis : {"dp", "ep", "tp"}) {
    std::set<std::string> keys;
    for (int64_t rank = 0; rank < 8; ++rank) {
      const std::vector<AxisGroup> groupsOfRank = meshAxisGroups(meshOfRank(axes, rank), rank, "p");
      const AxisGroup& group = groupOf(groupsOfRank, axis);
      keys.insert(group.key);
      for (int64_t member : group.ranks) {
        const std::vector<AxisGroup> groupsOfMember = meshAxisGroups(meshOfRank(axes, member), member, "p");
        EXPECT_EQ(groupOf(groupsOfMember, axis).key, group.key);
      }
    }
    EXPECT_EQ(keys.size(), 4u) << axis;
  }
}

TEST(MeshGroups, RejectsAPlanOfAnotherRank) {
  std::vector<MeshAxis> mesh = meshOfRank({{"dp", 2}, {"tp", 2}}, 1);
  try {
    meshAxisGroups(mesh, 2, "rank-2.dgplan");
    FAIL();
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(),
                 "rank-2.dgplan: mesh axis 'dp': the plan records coordinate 0, but rank 2 has coordinate 1 "
                 "(row-major over the mesh axes)");
  }
  EXPECT_THROW(meshCoordinates(mesh, 4), InputError);
}

// Four ranks of {dp = 2, tp = 2} meet in one directory; each axis' all-reduce sums its group only,
// the world's sums all four, and a size-1 axis needs no peer.
TEST(MeshCommunicators, EachAxisReducesOverItsGroup) {
  const std::string directory =
      (std::filesystem::temp_directory_path() / ("dgemma-mesh-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(directory);
  RendezvousOptions rendezvous;
  rendezvous.storeDirectory = directory;
  rendezvous.timeout = 10s;
  std::vector<float> tpSums(4), dpSums(4), worldSums(4);
  const std::vector<std::string> failures =
      test::runOnRanks(4, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>&) {
        std::unique_ptr<Backend> backend = createBackend("cpu", 1);
        std::vector<MeshAxis> mesh = meshOfRank({{"dp", 2}, {"pp", 1}, {"tp", 2}}, rank);
        MeshCommunicators communicators = connectMesh(mesh, *backend, rank, 4, rendezvous, "rank plan");
        ExecContext context;
        float tp = static_cast<float>(rank), dp = static_cast<float>(rank), world = static_cast<float>(rank);
        communicators.axes.axis("tp", "test").allReduce(context, &tp, 1, DType::F32, ReduceOp::Sum);
        communicators.axes.axis("dp", "test").allReduce(context, &dp, 1, DType::F32, ReduceOp::Sum);
        communicators.world->allReduce(context, &world, 1, DType::F32, ReduceOp::Sum);
        if (communicators.axes.axis("pp", "test").size() != 1) throw std::runtime_error("pp is not a group of one");
        tpSums[rank] = tp;
        dpSums[rank] = dp;
        worldSums[rank] = world;
      });
  std::filesystem::remove_all(directory);
  for (int64_t rank = 0; rank < 4; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
  EXPECT_EQ(tpSums, (std::vector<float>{1, 1, 5, 5}));   // {0, 1} and {2, 3}
  EXPECT_EQ(dpSums, (std::vector<float>{2, 4, 2, 4}));   // {0, 2} and {1, 3}
  EXPECT_EQ(worldSums, (std::vector<float>{6, 6, 6, 6}));
}

TEST(MeshCommunicators, RejectsAMeshOfAnotherSize) {
  std::unique_ptr<Backend> backend = createBackend("cpu", 1);
  EXPECT_THROW(connectMesh(meshOfRank({{"tp", 2}}, 0), *backend, 0, 4, RendezvousOptions{}, "p"), InputError);
}

}  // namespace
}  // namespace dgemma
