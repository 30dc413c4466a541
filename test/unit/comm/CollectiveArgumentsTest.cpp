// The checks and the ragged all-to-all plan the NCCL communicator runs on (runtime/comm/
// CollectiveArguments.h), on the CPU: the plan, carried out with memcpy between simulated ranks,
// must leave every receive buffer byte for byte as GlooCommunicator::allToAllV does (the semantics
// of Communicator::allToAllV); and, in builds with NCCL, the errors of a run without NCCL or a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/comm/CollectiveArguments.h"
#include "runtime/comm/GlooCommunicator.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

// The message of the InputError `body` throws ("" when it throws none).
template <typename Body>
std::string inputErrorOf(Body&& body) {
  try {
    body();
  } catch (const InputError& error) {
    return error.what();
  }
  return "";
}

TEST(CollectiveArgumentsTest, RootAndCountChecksNameTheCollectiveAndTheArgument) {
  checkCollectiveRoot("nccl broadcast", 0, 2);
  checkCollectiveRoot("nccl broadcast", 1, 2);
  EXPECT_EQ(inputErrorOf([] { checkCollectiveRoot("nccl broadcast", 2, 2); }),
            "nccl broadcast: root: expected a rank in [0, 2), got 2");
  EXPECT_EQ(inputErrorOf([] { checkCollectiveRoot("nccl reduceToRoot", -1, 4); }),
            "nccl reduceToRoot: root: expected a rank in [0, 4), got -1");
  checkCollectiveCount("nccl allReduce", 0);
  EXPECT_EQ(inputErrorOf([] { checkCollectiveCount("nccl allReduce", -3); }),
            "nccl allReduce: count: expected a non-negative element count, got -3");
}

TEST(CollectiveArgumentsTest, RaggedPlanScalesElementsToBytesAndKeepsZeroBlocks) {
  // Rank order on both sides, a gap before peer 2's receive block, peer 1 sends nothing.
  const std::vector<PeerTransfer> plan = planRaggedExchange("test", 3, 4, {2, 0, 5}, {0, 2, 2}, {1, 0, 3}, {0, 1, 4});
  ASSERT_EQ(plan.size(), 3u);
  const uint64_t expected[3][5] = {{0, 0, 8, 0, 4}, {1, 8, 0, 4, 0}, {2, 8, 20, 16, 12}};
  for (size_t peer = 0; peer < 3; ++peer) {
    EXPECT_EQ(plan[peer].peer, expected[peer][0]);
    EXPECT_EQ(plan[peer].sendOffset, expected[peer][1]) << "peer " << peer;
    EXPECT_EQ(plan[peer].sendBytes, expected[peer][2]) << "peer " << peer;
    EXPECT_EQ(plan[peer].recvOffset, expected[peer][3]) << "peer " << peer;
    EXPECT_EQ(plan[peer].recvBytes, expected[peer][4]) << "peer " << peer;
  }
}

TEST(CollectiveArgumentsTest, RaggedPlanRejectsBadArgumentsNamingThem) {
  EXPECT_EQ(inputErrorOf([] { planRaggedExchange("nccl allToAllV", 2, 4, {1}, {0, 0}, {1, 1}, {0, 1}); }),
            "nccl allToAllV: sendCounts: expected 2 entries (one per rank), got 1");
  EXPECT_EQ(inputErrorOf([] { planRaggedExchange("nccl allToAllV", 2, 4, {1, 1}, {0, 1}, {1, 1}, {0, 1, 2}); }),
            "nccl allToAllV: recvOffsets: expected 2 entries (one per rank), got 3");
  EXPECT_NE(inputErrorOf([] { planRaggedExchange("nccl allToAllV", 2, 4, {1, -1}, {0, 1}, {1, 1}, {0, 1}); })
                .find("nccl allToAllV: sendCounts: expected entries in [0, "),
            std::string::npos);
  EXPECT_NE(inputErrorOf([] { planRaggedExchange("nccl allToAllV", 2, 4, {1, 1}, {-2, 1}, {1, 1}, {0, 1}); })
                .find("got -2"),
            std::string::npos);
  // Offsets whose byte positions would overflow.
  EXPECT_NE(inputErrorOf([] { planRaggedExchange("nccl allToAllV", 1, 8, {1}, {int64_t{1} << 61}, {1}, {0}); }),
            "");
  EXPECT_EQ(inputErrorOf([] { planRaggedExchange("nccl allToAllV", 3, 2, {0, 0, 0}, {0, 0, 0}, {2, 3, 1}, {4, 0, 2}); }),
            "nccl allToAllV: recvOffsets: the blocks from rank 1 and rank 2 overlap (elements [0, 3) and [2, 3))");
  // Empty blocks overlap nothing; sends may overlap (they are only read).
  EXPECT_EQ(inputErrorOf([] { planRaggedExchange("t", 3, 2, {2, 2, 2}, {0, 0, 0}, {2, 0, 2}, {0, 1, 2}); }), "");
}

// One rank's side of a ragged exchange laid out with gaps and its blocks in a shuffled order.
struct RankLayout {
  std::vector<int64_t> sendCounts, sendOffsets, recvCounts, recvOffsets;
  std::vector<float> send;
  size_t recvElements = 0;
};

// Places `counts` blocks in a random order with random gaps; returns the offsets and the total.
std::pair<std::vector<int64_t>, int64_t> scatterBlocks(const std::vector<int64_t>& counts, std::mt19937& random) {
  std::vector<size_t> order(counts.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), random);
  std::vector<int64_t> offsets(counts.size());
  int64_t next = 0;
  for (size_t peer : order) {
    next += static_cast<int64_t>(random() % 3);  // a gap of 0 to 2 elements
    offsets[peer] = next;
    next += counts[peer];
  }
  return {offsets, next + 1};
}

TEST(CollectiveArgumentsTest, RaggedPlanCarriedOutByCopiesMatchesGlooAllToAllV) {
  constexpr int64_t kRanks = 3;
  constexpr float kUntouched = -7.0f;
  for (uint32_t seed = 1; seed <= 4; ++seed) {
    std::mt19937 random(seed);
    // count[source][destination] elements, zero blocks included.
    std::vector<std::vector<int64_t>> count(kRanks, std::vector<int64_t>(kRanks));
    for (auto& row : count)
      for (int64_t& value : row) value = static_cast<int64_t>(random() % 4);
    std::vector<RankLayout> ranks(kRanks);
    for (int64_t rank = 0; rank < kRanks; ++rank) {
      RankLayout& layout = ranks[rank];
      for (int64_t peer = 0; peer < kRanks; ++peer) {
        layout.sendCounts.push_back(count[rank][peer]);
        layout.recvCounts.push_back(count[peer][rank]);
      }
      auto [sendOffsets, sendElements] = scatterBlocks(layout.sendCounts, random);
      auto [recvOffsets, recvElements] = scatterBlocks(layout.recvCounts, random);
      layout.sendOffsets = sendOffsets;
      layout.recvOffsets = recvOffsets;
      layout.recvElements = static_cast<size_t>(recvElements);
      for (int64_t i = 0; i < sendElements; ++i) layout.send.push_back(static_cast<float>(1000 * rank + i));
    }

    // Gloo, three ranks as threads.
    std::vector<std::vector<float>> byGloo(kRanks);
    const std::vector<std::string> failures =
        test::runOnRanks(kRanks, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
          std::unique_ptr<Communicator> communicator = createGlooCommunicator(store, rank, kRanks, 10s);
          const RankLayout& layout = ranks[rank];
          std::vector<float> recv(layout.recvElements, kUntouched);
          ExecContext context;
          communicator->allToAllV(context, layout.send.data(), layout.sendCounts, layout.sendOffsets, recv.data(),
                                  layout.recvCounts, layout.recvOffsets, DType::F32);
          byGloo[rank] = recv;
        });
    for (int64_t rank = 0; rank < kRanks; ++rank) ASSERT_EQ(failures[rank], "") << "rank " << rank;

    // The plans, one per rank, carried out as the NCCL group does: rank r's send to p lands in p's
    // receive from r.
    std::vector<std::vector<PeerTransfer>> plans;
    for (const RankLayout& layout : ranks)
      plans.push_back(planRaggedExchange("test", kRanks, sizeof(float), layout.sendCounts, layout.sendOffsets,
                                         layout.recvCounts, layout.recvOffsets));
    for (int64_t rank = 0; rank < kRanks; ++rank) {
      std::vector<float> byPlan(ranks[rank].recvElements, kUntouched);
      for (int64_t peer = 0; peer < kRanks; ++peer) {
        const PeerTransfer& receive = plans[rank][peer];
        const PeerTransfer& send = plans[peer][rank];
        ASSERT_EQ(receive.peer, peer);
        ASSERT_EQ(receive.recvBytes, send.sendBytes) << "seed " << seed << ": rank " << rank << " from " << peer;
        std::memcpy(reinterpret_cast<uint8_t*>(byPlan.data()) + receive.recvOffset,
                    reinterpret_cast<const uint8_t*>(ranks[peer].send.data()) + send.sendOffset, send.sendBytes);
      }
      EXPECT_EQ(byPlan, byGloo[rank]) << "seed " << seed << ": rank " << rank;
    }
  }
}

}  // namespace
}  // namespace dgemma
