// The expert-dispatch kernels: moe_dispatch against a hand-worked table; the whole all-to-all chain
// (dispatch, permute, the exchange done here by hand, local experts, the way back, combine) for G
// simulated ranks against moe_experts and moe_experts_backward on every token and expert at once;
// and the run-time checks of counts and slots.
#include <numeric>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

struct Routing {
  std::vector<int64_t> slots, sendCounts, expertCounts;
};

Routing dispatch(const std::vector<int64_t>& indices, int64_t tokens, int64_t topK, int64_t peers, int64_t experts) {
  KernelCall call("moe_dispatch", {{"num_experts", experts}});
  call.input(DType::I64, {tokens, topK}, indices);
  call.output(DType::I64, {tokens, topK}).output(DType::I64, {peers}).output(DType::I64, {peers, experts / peers});
  call.run();
  return {call.result<int64_t>(0), call.result<int64_t>(1), call.result<int64_t>(2)};
}

TEST(MoeDispatchKernel, GroupsRoutesByPeerThenExpertInRouteOrder) {
  // Four experts on two peers (0, 1 | 2, 3); three tokens, top-2.
  const Routing routing = dispatch({3, 0, 1, 3, 0, 2}, 3, 2, 2, 4);
  // Expert 0: routes (0,1), (2,0) -> slots 0, 1; expert 1: (1,0) -> 2; expert 2: (2,1) -> 3;
  // expert 3: (0,0), (1,1) -> 4, 5.
  EXPECT_EQ(routing.slots, (std::vector<int64_t>{4, 0, 2, 5, 1, 3}));
  EXPECT_EQ(routing.sendCounts, (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(routing.expertCounts, (std::vector<int64_t>{2, 1, 1, 2}));
  // No routes at all: every count is zero.
  const Routing none = dispatch({}, 0, 2, 2, 4);
  EXPECT_TRUE(none.slots.empty());
  EXPECT_EQ(none.sendCounts, (std::vector<int64_t>{0, 0}));
}

TEST(MoeDispatchKernel, OutOfRangeIndexIsARunTimeErrorNamingIt) {
  try {
    dispatch({0, 1, 4, 2}, 2, 2, 2, 4);
    ADD_FAILURE() << "index 4 was accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(std::string(error.what()), "step 0 (moe_dispatch): expert index 4 at indices[1, 0] is outside [0, num_experts = 4)");
  }
}

TEST(MoeDispatchKernel, FactoryRejectsExpertsThatThePeersDoNotDivide) {
  KernelCall call("moe_dispatch", {{"num_experts", 5}});
  call.input(DType::I64, {1, 1}, std::vector<int64_t>{0});
  call.output(DType::I64, {1, 1}).output(DType::I64, {2}).output(DType::I64, {2, 2});
  EXPECT_EQ(factoryError(call), "step 0 (moe_dispatch): attribute 'num_experts': 5 is not a positive multiple of the 2 peers");
}

TEST(MoePermuteKernel, SlotsThatAreNotAPermutationAreARunTimeError) {
  for (const auto& [slots, message] :
       std::vector<std::pair<std::vector<int64_t>, std::string>>{{{0, 2, 2, 1}, "slots[2] = 2 repeats an earlier slot"},
                                                                  {{0, 4, 2, 1}, "slots[1] = 4 is outside [0, 4)"}}) {
    for (const char* op : {"moe_permute", "moe_combine"}) {
      KernelCall call(op);
      const bool permute = std::string(op) == "moe_permute";
      call.input(DType::F64, {permute ? 2 : 4, 1}, std::vector<double>(permute ? 2 : 4, 1.0));
      call.input(DType::I64, {2, 2}, slots);
      call.output(DType::F64, {permute ? 4 : 2, 1});
      try {
        call.run();
        ADD_FAILURE() << op << " accepted the slots";
      } catch (const RuntimeError& error) {
        EXPECT_EQ(std::string(error.what()), call.where() + ": " + message +
                                                 ": the slots must be a permutation, as moe_dispatch makes them");
      }
    }
  }
}

TEST(MoeLocalExpertsKernel, CountsBeyondTheCapacityAreARunTimeError) {
  KernelCall call("moe_local_experts");
  call.input(DType::F64, {3, 2}, std::vector<double>(6, 0.0)).input(DType::I64, {2, 1}, std::vector<int64_t>{2, 2});
  call.input(DType::F64, {1, 2, 2}, std::vector<double>(4, 0.0)).input(DType::F64, {1, 2, 1}, std::vector<double>(2, 0.0));
  call.output(DType::F64, {3, 2});
  try {
    call.run();
    ADD_FAILURE() << "four counted rows in a buffer of three were accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(std::string(error.what()),
              "step 0 (moe_local_experts): expert_counts count 4 rows, more than the 3 received rows the buffer holds");
  }
}

// ---------------------------------------------------------------------------------------------
// The chain on G simulated ranks against moe_experts on all of them.

struct ChainCase {
  int64_t peers = 2, tokens = 3, hidden = 5, topK = 2, localExperts = 2, expertHidden = 4;
  std::vector<int64_t> indices;  // [peers · tokens, topK], global expert ids, rank r's tokens in block r
  int64_t experts() const { return peers * localExperts; }
  int64_t capacity() const { return peers * tokens * topK; }
};

struct ChainValues {
  std::vector<double> x, weights, gateUp, down, dy;
};

ChainValues randomChainValues(const ChainCase& c, uint32_t seed) {
  const int64_t allTokens = c.peers * c.tokens, E = c.experts(), H = c.hidden, I = c.expertHidden;
  return {randomValues<double>(allTokens * H, seed, -1, 1), randomValues<double>(allTokens * c.topK, seed + 1, -0.5, 1),
          randomValues<double>(E * 2 * I * H, seed + 2, -0.7, 0.7), randomValues<double>(E * H * I, seed + 3, -0.7, 0.7),
          randomValues<double>(allTokens * H, seed + 4, -1, 1)};
}

// Elements [first·width, (first + count)·width) of `values`.
std::vector<double> rowsOf(const std::vector<double>& values, int64_t first, int64_t count, int64_t width) {
  return std::vector<double>(values.begin() + first * width, values.begin() + (first + count) * width);
}
std::vector<int64_t> rowsOf(const std::vector<int64_t>& values, int64_t first, int64_t count, int64_t width) {
  return std::vector<int64_t>(values.begin() + first * width, values.begin() + (first + count) * width);
}

// dg.all_to_all by hand: rank r sends its rows' blocks (grouped by peer, counts[r][p] rows each);
// rank p receives them in source order into `capacity` rows, zeros after.
std::vector<std::vector<double>> exchange(const std::vector<std::vector<double>>& sent,
                                          const std::vector<std::vector<int64_t>>& counts, int64_t width,
                                          int64_t capacity) {
  const size_t peers = sent.size();
  std::vector<std::vector<double>> received(peers, std::vector<double>(capacity * width, 0.0));
  std::vector<int64_t> filled(peers, 0);
  for (size_t source = 0; source < peers; ++source) {
    int64_t offset = 0;
    for (size_t peer = 0; peer < peers; ++peer) {
      const int64_t count = counts[source][peer];
      EXPECT_LE(filled[peer] + count, capacity);
      std::copy_n(sent[source].begin() + offset * width, count * width, received[peer].begin() + filled[peer] * width);
      filled[peer] += count;
      offset += count;
    }
  }
  return received;
}

// What each peer received from each source: the transpose of the send counts.
std::vector<std::vector<int64_t>> receivedCounts(const std::vector<std::vector<int64_t>>& sendCounts) {
  std::vector<std::vector<int64_t>> received(sendCounts.size(), std::vector<int64_t>(sendCounts.size()));
  for (size_t source = 0; source < sendCounts.size(); ++source)
    for (size_t peer = 0; peer < sendCounts.size(); ++peer) received[peer][source] = sendCounts[source][peer];
  return received;
}

std::vector<double> permute(const std::vector<double>& values, const std::vector<int64_t>& slots, int64_t rows, int64_t k,
                            int64_t width) {
  KernelCall call("moe_permute");
  call.input(DType::F64, {rows, width}, values).input(DType::I64, {rows, k}, slots).output(DType::F64, {rows * k, width});
  call.run();
  return call.result<double>();
}

std::vector<double> combine(const std::vector<double>& rows, const std::vector<int64_t>& slots, const std::vector<double>* weights,
                            int64_t tokens, int64_t k, int64_t width) {
  KernelCall call("moe_combine");
  call.input(DType::F64, {tokens * k, width}, rows).input(DType::I64, {tokens, k}, slots);
  if (weights) call.input(DType::F64, {tokens, k}, *weights);
  call.output(DType::F64, {tokens, width});
  call.run();
  return call.result<double>();
}

struct ChainResult {
  std::vector<double> y, dx, dWeights, dGateUp, dDown;  // all ranks' rows, in rank order
};

// Every rank's forward and backward through the dispatch kernels.
ChainResult runChain(const ChainCase& c, const ChainValues& v) {
  const int64_t G = c.peers, N = c.tokens, k = c.topK, H = c.hidden, I = c.expertHidden, El = c.localExperts;
  const int64_t capacity = c.capacity();
  std::vector<Routing> routing;
  std::vector<std::vector<int64_t>> sendCounts;
  std::vector<std::vector<double>> xs, dys, ws;
  for (int64_t r = 0; r < G; ++r) {
    routing.push_back(dispatch(rowsOf(c.indices, r * N, N, k), N, k, G, c.experts()));
    sendCounts.push_back(routing[r].sendCounts);
    const std::vector<int64_t>& slots = routing[r].slots;
    xs.push_back(permute(rowsOf(v.x, r * N, N, H), slots, N, k, H));
    dys.push_back(permute(rowsOf(v.dy, r * N, N, H), slots, N, k, H));
    ws.push_back(permute(rowsOf(v.weights, r * N, N, k), slots, N * k, 1, 1));  // k = 1: one value per route
  }
  // The counts exchange: peer p receives row p of every source's expert_counts.
  std::vector<std::vector<int64_t>> expertCountsAt(G);
  for (int64_t p = 0; p < G; ++p)
    for (int64_t source = 0; source < G; ++source)
      for (int64_t e = 0; e < El; ++e) expertCountsAt[p].push_back(routing[source].expertCounts[p * El + e]);
  const auto xr = exchange(xs, sendCounts, H, capacity), dyr = exchange(dys, sendCounts, H, capacity),
             wr = exchange(ws, sendCounts, 1, capacity);

  std::vector<std::vector<double>> yr, dxr, dwr;
  ChainResult result;
  for (int64_t p = 0; p < G; ++p) {
    const std::vector<double> gateUp = rowsOf(v.gateUp, p * El, El, 2 * I * H), down = rowsOf(v.down, p * El, El, H * I);
    KernelCall forward("moe_local_experts");
    forward.input(DType::F64, {capacity, H}, xr[p]).input(DType::I64, {G, El}, expertCountsAt[p]);
    forward.input(DType::F64, {El, 2 * I, H}, gateUp).input(DType::F64, {El, H, I}, down);
    forward.output(DType::F64, {capacity, H});
    forward.run();
    yr.push_back(forward.result<double>());

    KernelCall backward("moe_local_experts_backward");
    backward.input(DType::F64, {capacity, H}, xr[p]).input(DType::F64, {capacity}, wr[p]);
    backward.input(DType::F64, {capacity, H}, dyr[p]).input(DType::I64, {G, El}, expertCountsAt[p]);
    backward.input(DType::F64, {El, 2 * I, H}, gateUp).input(DType::F64, {El, H, I}, down);
    backward.output(DType::F64, {capacity, H}).output(DType::F64, {capacity});
    backward.output(DType::F64, {El, 2 * I, H}).output(DType::F64, {El, H, I});
    backward.run();
    dxr.push_back(backward.result<double>(0));
    dwr.push_back(backward.result<double>(1));
    const std::vector<double> dGateUp = backward.result<double>(2), dDown = backward.result<double>(3);
    result.dGateUp.insert(result.dGateUp.end(), dGateUp.begin(), dGateUp.end());
    result.dDown.insert(result.dDown.end(), dDown.begin(), dDown.end());
  }
  const auto back = receivedCounts(sendCounts);
  const auto ys = exchange(yr, back, H, N * k), dxs = exchange(dxr, back, H, N * k), dws = exchange(dwr, back, 1, N * k);
  for (int64_t r = 0; r < G; ++r) {
    const std::vector<double> weights = rowsOf(v.weights, r * N, N, k);
    const std::vector<double> y = combine(ys[r], routing[r].slots, &weights, N, k, H);
    const std::vector<double> dx = combine(dxs[r], routing[r].slots, nullptr, N, k, H);
    const std::vector<double> dw = combine(dws[r], routing[r].slots, nullptr, N * k, 1, 1);
    result.y.insert(result.y.end(), y.begin(), y.end());
    result.dx.insert(result.dx.end(), dx.begin(), dx.end());
    result.dWeights.insert(result.dWeights.end(), dw.begin(), dw.end());
  }
  return result;
}

// moe_experts and moe_experts_backward on every rank's tokens with every expert.
ChainResult runWhole(const ChainCase& c, const ChainValues& v) {
  const int64_t tokens = c.peers * c.tokens, k = c.topK, H = c.hidden, I = c.expertHidden, E = c.experts();
  KernelCall forward("moe_experts", {{"expert_offset", 0}});
  forward.input(DType::F64, {tokens, H}, v.x).input(DType::F64, {tokens, k}, v.weights);
  forward.input(DType::I64, {tokens, k}, c.indices);
  forward.input(DType::F64, {E, 2 * I, H}, v.gateUp).input(DType::F64, {E, H, I}, v.down);
  forward.output(DType::F64, {tokens, H});
  forward.run();
  KernelCall backward("moe_experts_backward", {{"expert_offset", 0}});
  backward.input(DType::F64, {tokens, H}, v.x).input(DType::F64, {tokens, k}, v.weights);
  backward.input(DType::I64, {tokens, k}, c.indices);
  backward.input(DType::F64, {E, 2 * I, H}, v.gateUp).input(DType::F64, {E, H, I}, v.down);
  backward.input(DType::F64, {tokens, H}, v.dy);
  backward.output(DType::F64, {tokens, H}).output(DType::F64, {tokens, k});
  backward.output(DType::F64, {E, 2 * I, H}).output(DType::F64, {E, H, I});
  backward.run();
  return {forward.result<double>(), backward.result<double>(0), backward.result<double>(1), backward.result<double>(2),
          backward.result<double>(3)};
}

void expectChainMatchesWhole(const ChainCase& c, uint32_t seed) {
  const ChainValues values = randomChainValues(c, seed);
  const ChainResult chain = runChain(c, values), whole = runWhole(c, values);
  expectClose(chain.y, whole.y, 1e-12);
  expectClose(chain.dx, whole.dx, 1e-12);
  expectClose(chain.dWeights, whole.dWeights, 1e-12);
  expectClose(chain.dGateUp, whole.dGateUp, 1e-12);
  expectClose(chain.dDown, whole.dDown, 1e-12);
}

TEST(MoeDispatchChain, TwoRanksMatchTheExpertsOnAllTokens) {
  expectChainMatchesWhole({.indices = {0, 3, 2, 1, 3, 2, 1, 0, 2, 3, 0, 1}}, 201);
}

TEST(MoeDispatchChain, ARankThatReceivesNoRowsAndExpertsWithoutRoutes) {
  // Every route goes to rank 0's experts (0 and 1) and expert 1 gets none: rank 1 receives no rows,
  // its experts' gradients are zero, and it still sends its tokens out and gets their outputs back.
  expectChainMatchesWhole({.indices = std::vector<int64_t>(12, 0)}, 202);
  expectChainMatchesWhole({.topK = 1, .indices = {0, 0, 0, 0, 0, 0}}, 203);
}

TEST(MoeDispatchChain, FourRanksWithUnevenCounts) {
  ChainCase c{.peers = 4, .tokens = 5, .topK = 3, .localExperts = 2};
  for (int64_t route = 0; route < c.peers * c.tokens * c.topK; ++route) c.indices.push_back((route * 7 + route / 5) % 7);
  expectChainMatchesWhole(c, 204);
}

}  // namespace
}  // namespace dgemma::test
