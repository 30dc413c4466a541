// The training loop's multi-rank parts on ranks run as threads over Gloo: the world group's
// agreements over a mesh of several axes, and parameters saved from per-rank plans whose boxes
// split a tensor, then restored into plans of other layouts (docs/parallelism.md, "Sharded
// checkpoints and resume").
#include <gtest/gtest.h>
#include <gloo/rendezvous/prefix_store.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/GlooCommunicator.h"
#include "runtime/exec/Executor.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/train/ShardedSave.h"
#include "runtime/train/WorldGroup.h"
#include "support/Error.h"
#include "test/unit/TestSupport.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

namespace fs = std::filesystem;
using test::expectInputError;
using test::mentions;
using test::runOnRanks;
using test::TempDir;

using Store = std::shared_ptr<gloo::rendezvous::Store>;
constexpr std::chrono::milliseconds kTimeout{20000};

const nlohmann::json kModel = {{"model_config", {{"hidden_size", 6}}}};

ShardBox box(std::vector<int64_t> offset, std::vector<int64_t> shape) { return {std::move(offset), std::move(shape)}; }

// A rank's place in a mesh: its coordinates, row-major over `axes` (last fastest).
std::vector<MeshAxis> placeRank(const std::vector<std::pair<std::string, int64_t>>& axes, int64_t rank) {
  std::vector<MeshAxis> mesh(axes.size());
  for (size_t i = axes.size(); i-- > 0;) {
    mesh[i] = {axes[i].first, axes[i].second, rank % axes[i].second};
    rank /= axes[i].second;
  }
  return mesh;
}

// One communicator per axis: the ranks that differ from this one only along it, met under a prefix
// naming the axis and the other axes' coordinates.
std::unique_ptr<CommunicatorSet> meshCommunicators(const std::vector<MeshAxis>& mesh, const Store& store) {
  auto communicators = std::make_unique<CommunicatorSet>();
  for (size_t a = 0; a < mesh.size(); ++a) {
    std::string group = "axis-" + mesh[a].name;
    for (size_t other = 0; other < mesh.size(); ++other)
      if (other != a) group.append("-").append(std::to_string(mesh[other].coord));
    auto prefixed = std::make_shared<gloo::rendezvous::PrefixStore>(group, *store);
    communicators->add(mesh[a].name, createGlooCommunicator(prefixed, mesh[a].coord, mesh[a].size, kTimeout));
  }
  return communicators;
}

// A parameter of a rank's plan: its global shape and the box this rank holds.
struct Placement {
  std::string name;
  std::vector<int64_t> globalShape;
  ShardBox box;
  DType dtype = DType::F32;
};

// A plan with parameters only (no entry point): what saving and restoring see.
Plan rankPlan(const std::vector<std::pair<std::string, int64_t>>& axes, int64_t rank, const std::vector<Placement>& parameters) {
  Plan plan;
  plan.producer = "test";
  plan.rank = rank;
  plan.mesh = placeRank(axes, rank);
  for (const MeshAxis& axis : plan.mesh) plan.worldSize *= axis.size;
  plan.arenas = {{"persistent", true, 0, 64}, {"scratch", false, 0, 64}};
  for (const Placement& placement : parameters) {
    Buffer buffer{static_cast<int64_t>(plan.buffers.size()), placement.name, placement.dtype, placement.box.shape, 0,
                  (plan.arenas[0].bytes + 63) / 64 * 64, std::nullopt, std::nullopt};
    plan.arenas[0].bytes = buffer.offset + buffer.bytes();
    plan.buffers.push_back(buffer);
    Parameter parameter;
    parameter.name = placement.name;
    parameter.buffer = buffer.id;
    parameter.globalShape = placement.globalShape;
    parameter.shardOffset = placement.box.offset;
    parameter.shardShape = placement.box.shape;
    plan.parameters.push_back(parameter);
  }
  return plan;
}

// Distinct values for every element, so a misplaced one shows.
HostTensor patterned(std::vector<int64_t> shape, float seed) {
  HostTensor tensor(DType::F32, std::move(shape));
  for (int64_t i = 0; i < tensor.numElements(); ++i) tensor.as<float>()[i] = seed + 0.25f * static_cast<float>(i);
  return tensor;
}

HostTensor sliceOf(const HostTensor& whole, const ShardBox& part) {
  HostTensor result(whole.dtype, part.shape);
  copyRegion(whole.data.data(), wholeBox(whole.shape), result.data.data(), part, part, dtypeSize(whole.dtype));
  return result;
}

// One rank of a run: its plan loaded on the CPU backend with its communicators.
struct Rank {
  Rank(Plan rankPlan, const Store& store)
      : plan(std::move(rankPlan)),
        backend(createBackend("cpu", 1)),
        communicators(meshCommunicators(plan.mesh, store)),
        executor(plan, *backend, *communicators, "rank-" + std::to_string(plan.rank) + ".dgplan"),
        world(plan, *backend, *communicators) {}

  Plan plan;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<CommunicatorSet> communicators;
  Executor executor;
  WorldGroup world;
};

void expectNoFailures(const std::vector<std::string>& failures) {
  for (size_t rank = 0; rank < failures.size(); ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

TEST(WorldGroupTest, GathersInRankOrderOverEveryAxis) {
  const std::vector<std::pair<std::string, int64_t>> axes = {{"dp", 2}, {"ep", 1}, {"tp", 2}};
  std::vector<std::vector<int64_t>> gathered(4);
  std::vector<int64_t> least(4), fromZero(4);
  expectNoFailures(runOnRanks(4, [&](int64_t rank, const Store& store) {
    Plan plan = rankPlan(axes, rank, {});
    auto backend = createBackend("cpu", 1);
    auto communicators = meshCommunicators(plan.mesh, store);
    WorldGroup world(plan, *backend, *communicators);
    EXPECT_EQ(world.rank(), rank);
    EXPECT_EQ(world.size(), 4);
    gathered[rank] = world.allGather({10 * rank, 10 * rank + 1});
    least[rank] = world.minimum(7 - rank);
    fromZero[rank] = world.fromRankZero(100 + rank);
    world.barrier();
  }));
  for (int64_t rank = 0; rank < 4; ++rank) {
    EXPECT_EQ(gathered[rank], (std::vector<int64_t>{0, 1, 10, 11, 20, 21, 30, 31})) << "rank " << rank;
    EXPECT_EQ(least[rank], 4) << "rank " << rank;
    EXPECT_EQ(fromZero[rank], 100) << "rank " << rank;
  }
}

TEST(WorldGroupTest, OneRankNeedsNoCollectiveAndAMisplacedCommunicatorIsRefused) {
  auto backend = createBackend("cpu", 1);
  CommunicatorSet none;
  WorldGroup single(rankPlan({}, 0, {}), *backend, none);
  EXPECT_EQ(single.allGather({3, 4}), (std::vector<int64_t>{3, 4}));
  EXPECT_EQ(single.minimum(5), 5);

  // A plan of two ranks on a session that opened a group of one for its axis.
  CommunicatorSet local;
  local.add("tp", std::make_unique<LocalCommunicator>(*backend));
  EXPECT_TRUE(mentions(expectInputError([&] { WorldGroup(rankPlan({{"tp", 2}}, 1, {}), *backend, local); }),
                       "mesh axis tp: the plan places rank 1 at 1 of 2, its communicator at 0 of 1"));
}

// The tensors of the save tests: a weight and its moment split between the ranks, a replicated norm.
struct Tensors {
  HostTensor w = patterned({4, 6}, 1.0f);
  HostTensor moment = patterned({4, 6}, -50.0f);
  HostTensor norm = patterned({6}, 100.0f);
};

std::vector<Placement> placements(const ShardBox& wBox, const ShardBox& normBox) {
  return {{"w", {4, 6}, wBox}, {"norm", {6}, normBox}, {"optimizer/exp_avg/w", {4, 6}, wBox}};
}

void fill(Executor& executor, const Tensors& tensors) {
  for (const Parameter& parameter : executor.plan().parameters) {
    const HostTensor& whole = parameter.name == "w" ? tensors.w : parameter.name == "norm" ? tensors.norm : tensors.moment;
    executor.setParameter(parameter.name, sliceOf(whole, {parameter.shardOffset, parameter.shardShape}));
  }
}

CheckpointState stateAt(int64_t step) {
  CheckpointState state;
  state.model = kModel;
  state.step = step;
  return state;
}

// TP = 2 by rows: rank r holds rows [2r, 2r + 2) of w and of its moment, and all of the norm.
std::vector<Placement> rowsOfRank(int64_t rank) { return placements(box({2 * rank, 0}, {2, 6}), box({0}, {6})); }

CheckpointSaveResult saveRows(Rank& rank, const std::string& saveDir, HostTensor& count,
                              const std::string& optimizerGroup = "optimizer") {
  const std::vector<SavedGroup> groups = {{"model", {"w", "norm"}, {}},
                                          {optimizerGroup, {"optimizer/exp_avg/w"}, {{optimizerGroup, "optimizer/step", &count}}}};
  return saveShardedCheckpoint(rank.world, rank.executor, saveDir, stateAt(3), groups, CheckpointSaveOptions{});
}

TEST(ShardedSaveTest, TwoRanksSplitByRowsLoadIntoOneRankAndIntoTwoRanksSplitByColumns) {
  TempDir dir;
  const Tensors tensors;
  std::vector<CheckpointSaveResult> saved(2);
  expectNoFailures(runOnRanks(2, [&](int64_t r, const Store& store) {
    Rank rank(rankPlan({{"tp", 2}}, r, rowsOfRank(r)), store);
    fill(rank.executor, tensors);
    HostTensor count(DType::I64, {});
    count.as<int64_t>()[0] = 3;
    saved[r] = saveRows(rank, dir / "ckpt", count);
  }));
  const std::string directory = dir / "ckpt/step-00000003";
  EXPECT_EQ(saved[0].directory, directory);
  EXPECT_EQ(saved[1].directory, directory);
  EXPECT_GT(saved[0].bytesWritten, 0u);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir / "ckpt")) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"step-00000003"});  // no temporary directory

  const CheckpointReader checkpoint = CheckpointReader::load(directory, kModel);
  EXPECT_EQ(checkpoint.worldSize(), 2);
  auto boxesOf = [&](const std::string& group, size_t index) { return checkpoint.manifest()["groups"][group]["tensors"][index]["boxes"]; };
  EXPECT_EQ(boxesOf("model", 0).size(), 2u);  // w: one box per rank
  ASSERT_EQ(boxesOf("model", 1).size(), 1u);  // the replicated norm: its first replica only
  EXPECT_EQ(boxesOf("model", 1)[0]["rank"], 0);
  ASSERT_EQ(boxesOf("optimizer", 1).size(), 1u);  // the step count, whole, by rank 0
  EXPECT_EQ(checkpoint.read("optimizer", "optimizer/step").as<int64_t>()[0], 3);

  // One rank: every box is the whole tensor.
  {
    Rank single(rankPlan({}, 0, placements(wholeBox({4, 6}), wholeBox({6}))), std::make_shared<gloo::rendezvous::HashStore>());
    restoreParameters(checkpoint, "model", {"w", "norm"}, single.executor);
    restoreParameters(checkpoint, "optimizer", {"optimizer/exp_avg/w"}, single.executor);
    EXPECT_EQ(single.executor.parameter("w").data, tensors.w.data);
    EXPECT_EQ(single.executor.parameter("norm").data, tensors.norm.data);
    EXPECT_EQ(single.executor.parameter("optimizer/exp_avg/w").data, tensors.moment.data);
  }
  // Two ranks split by columns: each assembles its box from both saved row boxes.
  expectNoFailures(runOnRanks(2, [&](int64_t r, const Store& store) {
    const ShardBox columns = box({0, 3 * r}, {4, 3});
    Rank rank(rankPlan({{"tp", 2}}, r, placements(columns, box({0}, {6}))), store);
    restoreParameters(checkpoint, "model", {"w", "norm"}, rank.executor);
    restoreParameters(checkpoint, "optimizer", {"optimizer/exp_avg/w"}, rank.executor);
    EXPECT_EQ(rank.executor.parameter("w").data, sliceOf(tensors.w, columns).data) << "rank " << r;
    EXPECT_EQ(rank.executor.parameter("optimizer/exp_avg/w").data, sliceOf(tensors.moment, columns).data) << "rank " << r;
    EXPECT_EQ(rank.executor.parameter("norm").data, tensors.norm.data) << "rank " << r;
    // Restoring runs no collective. A gloo rendezvous can return on one rank before its peer has
    // finished, so without this a rank could tear its pairs down under a peer that is still
    // connecting ("Connection closed by peer", seen under ASan's slower start-up).
    rank.world.barrier();
  }));
}

// A plan whose global shape differs from the saved one is refused by name.
TEST(ShardedSaveTest, RestoringIntoAnotherGlobalShapeNamesTheTensor) {
  TempDir dir;
  const Tensors tensors;
  expectNoFailures(runOnRanks(2, [&](int64_t r, const Store& store) {
    Rank rank(rankPlan({{"tp", 2}}, r, rowsOfRank(r)), store);
    fill(rank.executor, tensors);
    HostTensor count(DType::I64, {});
    saveRows(rank, dir / "ckpt", count);
  }));
  const CheckpointReader checkpoint = CheckpointReader::load(dir / "ckpt/step-00000003", kModel);
  Rank wider(rankPlan({}, 0, {{"w", {4, 8}, wholeBox({4, 8})}}), std::make_shared<gloo::rendezvous::HashStore>());
  EXPECT_TRUE(mentions(expectInputError([&] { restoreParameters(checkpoint, "model", {"w"}, wider.executor); }),
                       "group 'model': tensor 'w': the checkpoint holds it with the global shape [4, 6], this run's is [4, 8]"));
}

// A rank that cannot write fails the save on every rank, and nothing is committed.
TEST(ShardedSaveTest, AFailingRankFailsTheSaveOnEveryRankAndCommitsNothing) {
  TempDir dir;
  const Tensors tensors;
  std::vector<std::string> failures = runOnRanks(2, [&](int64_t r, const Store& store) {
    Rank rank(rankPlan({{"tp", 2}}, r, rowsOfRank(r)), store);
    fill(rank.executor, tensors);
    HostTensor count(DType::I64, {});
    saveRows(rank, dir / "ckpt", count, r == 1 ? "Optimizer" : "optimizer");  // not a group name on rank 1
  });
  EXPECT_TRUE(mentions(failures[0], "checkpoint " + (dir / "ckpt/step-00000003") + ": rank 1 failed")) << failures[0];
  EXPECT_TRUE(mentions(failures[1], "Optimizer")) << failures[1];
  EXPECT_TRUE(fs::is_empty(dir / "ckpt"));

  // Boxes that leave rows 3.. of w to no rank are refused by rank 0's commit, on both ranks.
  failures = runOnRanks(2, [&](int64_t r, const Store& store) {
    const ShardBox rows = r == 0 ? box({0, 0}, {2, 6}) : box({2, 0}, {1, 6});
    Rank rank(rankPlan({{"tp", 2}}, r, placements(rows, box({0}, {6}))), store);
    fill(rank.executor, tensors);
    HostTensor count(DType::I64, {});
    saveRows(rank, dir / "ckpt", count);
  });
  EXPECT_TRUE(mentions(failures[0], "tensor 'w': no rank writes [3:4, 0:6]")) << failures[0];
  EXPECT_TRUE(mentions(failures[1], "rank 0 failed")) << failures[1];
  EXPECT_TRUE(fs::is_empty(dir / "ckpt"));
}

}  // namespace
}  // namespace dgemma
