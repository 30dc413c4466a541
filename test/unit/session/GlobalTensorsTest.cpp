// Cutting a rank's box out of a global input, and assembling a global output from the ranks' boxes
// (docs/plan-format.md, "Header": inputs and outputs).
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>

#include "runtime/comm/GlooCommunicator.h"
#include "runtime/session/GlobalTensors.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

// A [4, 3] f32 tensor holding 0, 1, 2, ... row-major.
HostTensor iota(std::vector<int64_t> shape) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::iota(tensor.as<float>(), tensor.as<float>() + tensor.numElements(), 0.0f);
  return tensor;
}

std::vector<float> values(const HostTensor& tensor) {
  return std::vector<float>(tensor.as<float>(), tensor.as<float>() + tensor.numElements());
}

TEST(GlobalTensors, CutsABox) {
  HostTensor local = cutBox(iota({4, 3}), {4, 3}, ShardBox{{2, 1}, {2, 2}}, "x");
  EXPECT_EQ(local.shape, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(values(local), (std::vector<float>{7, 8, 10, 11}));
}

TEST(GlobalTensors, RejectsAGlobalTensorOfAnotherShape) {
  try {
    cutBox(iota({2, 3}), {4, 3}, ShardBox{{0, 0}, {2, 3}}, "batch.safetensors: tensor x");
    FAIL();
  } catch (const InputError& error) {
    EXPECT_STREQ(error.what(), "batch.safetensors: tensor x: expected the global shape [4,3], got [2,3]");
  }
}

TEST(GlobalTensors, NamedBufferBoxes) {
  Plan plan;
  plan.buffers.push_back({0, "x", DType::F32, {2, 3}, 0, 0, std::nullopt, std::nullopt});
  NamedBuffer whole("x", 0);
  EXPECT_EQ(globalShapeOf(whole, plan), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(boxOf(whole, plan), (ShardBox{{0, 0}, {2, 3}}));
  NamedBuffer sharded("x", 0);
  sharded.globalShape = {4, 3};
  sharded.shardOffset = {2, 0};
  EXPECT_EQ(globalShapeOf(sharded, plan), (std::vector<int64_t>{4, 3}));
  EXPECT_EQ(boxOf(sharded, plan), (ShardBox{{2, 0}, {2, 3}}));
}

// Runs `body(rank, world)` on `size` Gloo ranks (threads) and checks that none failed.
void onRanks(int64_t size, const std::function<void(int64_t, Communicator&)>& body) {
  const std::vector<std::string> failures =
      test::runOnRanks(size, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        std::unique_ptr<Communicator> world = createGlooCommunicator(store, rank, size, 10s);
        body(rank, *world);
      });
  for (int64_t rank = 0; rank < size; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

// Four ranks of {dp = 2, tp = 2}, a [4, 3] tensor split in rows over dp and replicated over tp:
// every rank ends with the whole tensor.
TEST(GlobalTensors, AssemblesRowBlocksHeldTwice) {
  const HostTensor global = iota({4, 3});
  std::vector<std::vector<float>> assembled(4);
  onRanks(4, [&](int64_t rank, Communicator& world) {
    const ShardBox box{{2 * (rank / 2), 0}, {2, 3}};
    HostTensor local = cutBox(global, {4, 3}, box, "x");
    assembled[rank] = values(assembleGlobal(world, local, box, {4, 3}, "output y"));
  });
  for (int64_t rank = 0; rank < 4; ++rank) EXPECT_EQ(assembled[rank], values(global)) << "rank " << rank;
}

TEST(GlobalTensors, AssemblesColumnBlocksAndScalars) {
  const HostTensor global = iota({2, 4});
  std::vector<std::vector<float>> assembled(2), scalars(2);
  onRanks(2, [&](int64_t rank, Communicator& world) {
    const ShardBox box{{0, 2 * rank}, {2, 2}};
    assembled[rank] = values(assembleGlobal(world, cutBox(global, {2, 4}, box, "x"), box, {2, 4}, "output y"));
    HostTensor scalar = iota({});
    scalars[rank] = values(assembleGlobal(world, scalar, ShardBox{}, {}, "output loss"));
  });
  for (int64_t rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(assembled[rank], values(global));
    EXPECT_EQ(scalars[rank], std::vector<float>{0});
  }
}

TEST(GlobalTensors, NamesTheUncoveredPart) {
  std::vector<std::string> errors(2);
  onRanks(2, [&](int64_t rank, Communicator& world) {
    const ShardBox box{{0, 0}, {2, 3}};  // both ranks claim the first half
    try {
      assembleGlobal(world, iota({2, 3}), box, {4, 3}, "output y of forward");
    } catch (const RuntimeError& error) {
      errors[rank] = error.what();
    }
  });
  for (const std::string& error : errors)
    EXPECT_EQ(error, "output y of forward: no rank holds the part [2:4, 0:3] of the global [4,3] tensor");
}

TEST(GlobalTensors, OneRankAssemblesFromItself) {
  LocalCommunicator world;
  const ShardBox box{{0, 0}, {4, 3}};
  EXPECT_EQ(values(assembleGlobal(world, iota({4, 3}), box, {4, 3}, "y")), values(iota({4, 3})));
}

}  // namespace
}  // namespace dgemma
