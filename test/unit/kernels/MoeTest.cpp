// moe_route against hand-worked examples and a sort-based reference; moe_experts against a per-token
// loop that evaluates each routed expert on its own; moe_experts and its backward kernel over blocks
// of the experts against the whole op; the kept gate/up pre-activations (gate_up_rows) against a
// per-route reference and the backward reading them against the backward recomputing them; and the
// factories' checks.
#include <cmath>
#include <numbers>
#include <numeric>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

// ---------------------------------------------------------------------------------------------
// moe_route

template <typename T>
struct Routing {
  std::vector<T> weights;
  std::vector<int64_t> indices;
};

template <typename T>
Routing<T> runRoute(DType dtype, int64_t tokens, int64_t experts, int64_t topK, const std::vector<T>& logits,
                    const std::vector<T>& expertScale, ThreadPool* threads = nullptr) {
  KernelCall call("moe_route", {{"top_k", topK}});
  call.input(dtype, {tokens, experts}, logits).input(dtype, {experts}, expertScale);
  call.output(dtype, {tokens, topK}).output(DType::I64, {tokens, topK});
  call.run(threads);
  return {call.result<T>(0), call.result<int64_t>(1)};
}

// Softmax in double, a stable sort by descending probability (equal ones keep ascending ids), the
// first k renormalised and scaled.
Routing<double> routeReference(int64_t tokens, int64_t experts, int64_t topK, const std::vector<double>& logits,
                               const std::vector<double>& expertScale) {
  Routing<double> result;
  for (int64_t n = 0; n < tokens; ++n) {
    const double* row = logits.data() + n * experts;
    const double maximum = *std::max_element(row, row + experts);
    std::vector<double> probabilities(experts);
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += probabilities[e] = std::exp(row[e] - maximum);
    for (double& p : probabilities) p /= sum;
    std::vector<int64_t> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return probabilities[a] > probabilities[b]; });
    double chosen = 0;
    for (int64_t j = 0; j < topK; ++j) chosen += probabilities[order[j]];
    for (int64_t j = 0; j < topK; ++j) {
      result.weights.push_back(probabilities[order[j]] / chosen * expertScale[order[j]]);
      result.indices.push_back(order[j]);
    }
  }
  return result;
}

TEST(MoeRouteKernel, HandWorkedExample) {
  // Token 0: logits are logs of probabilities 0.1, 0.4, 0.2, 0.3; top-2 is experts 1 (0.4) and 3
  // (0.3), renormalised to 4/7 and 3/7, then scaled by 2 and 0.5.
  // Token 1: probabilities 0.25, 0.05, 0.6, 0.1 -> experts 2 and 0, weights 0.6/0.85 and 0.25/0.85.
  const std::vector<double> logits = {std::log(0.1), std::log(0.4),  std::log(0.2), std::log(0.3),
                                      std::log(0.25), std::log(0.05), std::log(0.6), std::log(0.1)};
  const std::vector<double> scale = {1.5, 2.0, 3.0, 0.5};
  const Routing<double> routing = runRoute(DType::F64, 2, 4, 2, logits, scale);
  EXPECT_EQ(routing.indices, (std::vector<int64_t>{1, 3, 2, 0}));
  expectClose(routing.weights, {4.0 / 7 * 2.0, 3.0 / 7 * 0.5, 0.6 / 0.85 * 3.0, 0.25 / 0.85 * 1.5}, 1e-12);

  const Routing<float> routing32 = runRoute(DType::F32, 2, 4, 2, std::vector<float>(logits.begin(), logits.end()),
                                            std::vector<float>(scale.begin(), scale.end()));
  EXPECT_EQ(routing32.indices, (std::vector<int64_t>{1, 3, 2, 0}));
  expectClose(routing32.weights, {4.0 / 7 * 2.0, 3.0 / 7 * 0.5, 0.6 / 0.85 * 3.0, 0.25 / 0.85 * 1.5}, 1e-5);
}

TEST(MoeRouteKernel, TiesGoToTheLowerExpertId) {
  // Token 0: experts 1 and 2 tie for first and are listed 1, 2. Token 1: all equal, so 0, 1, 2.
  // Token 2: experts 3 and 0 tie for second behind 2.
  const std::vector<float> logits = {1, 2, 2, 0, 3, 3, 3, 3, 0.5f, -1, 4, 0.5f};
  const std::vector<float> scale = {1, 1, 1, 1};
  const Routing<float> routing = runRoute(DType::F32, 3, 4, 3, logits, scale);
  EXPECT_EQ(routing.indices, (std::vector<int64_t>{1, 2, 0, 0, 1, 2, 2, 0, 3}));
  const std::vector<double> third(3, 1.0 / 3);
  expectClose(std::vector<float>(routing.weights.begin() + 3, routing.weights.begin() + 6), third, 1e-6);
}

TEST(MoeRouteKernel, TopKOfAllExpertsSortsAndKeepsTheSoftmax) {
  // With k = E the renormalisation divides by 1: the weights are the probabilities times the scale.
  const std::vector<double> logits = randomValues<double>(3 * 5, 91, -3, 3);
  const std::vector<double> scale = randomValues<double>(5, 92, 0.5, 2);
  const Routing<double> routing = runRoute(DType::F64, 3, 5, 5, logits, scale);
  const Routing<double> expected = routeReference(3, 5, 5, logits, scale);
  EXPECT_EQ(routing.indices, expected.indices);
  expectClose(routing.weights, expected.weights, 1e-12);
  for (int64_t n = 0; n < 3; ++n) {
    std::vector<int64_t> experts(routing.indices.begin() + n * 5, routing.indices.begin() + n * 5 + 5);
    std::sort(experts.begin(), experts.end());
    EXPECT_EQ(experts, (std::vector<int64_t>{0, 1, 2, 3, 4}));
  }
}

TEST(MoeRouteKernel, ManyTokensMatchTheReference) {
  ThreadPool threads(2);
  const int64_t tokens = 300, experts = 16, topK = 4;
  const std::vector<double> logits = randomValues<double>(tokens * experts, 93, -4, 4);
  const std::vector<double> scale = randomValues<double>(experts, 94, 0.5, 2);
  const Routing<double> expected = routeReference(tokens, experts, topK, logits, scale);

  const Routing<double> routing = runRoute(DType::F64, tokens, experts, topK, logits, scale, &threads);
  EXPECT_EQ(routing.indices, expected.indices);
  expectClose(routing.weights, expected.weights, 1e-12);

  const std::vector<float> logits32(logits.begin(), logits.end()), scale32(scale.begin(), scale.end());
  const Routing<double> expected32 = routeReference(tokens, experts, topK, std::vector<double>(logits32.begin(), logits32.end()),
                                                    std::vector<double>(scale32.begin(), scale32.end()));
  const Routing<float> routing32 = runRoute(DType::F32, tokens, experts, topK, logits32, scale32, &threads);
  EXPECT_EQ(routing32.indices, expected32.indices);
  expectClose(routing32.weights, expected32.weights, 1e-5);
}

size_t elementCount(const std::vector<int64_t>& shape) {
  int64_t elements = 1;
  for (int64_t dim : shape) elements *= dim;
  return static_cast<size_t>(elements);
}

KernelCall routeCall(int64_t topK, std::vector<int64_t> logitsShape = {3, 4}, std::vector<int64_t> scaleShape = {4},
                     std::vector<int64_t> weightsShape = {3, 2}) {
  KernelCall call("moe_route", {{"top_k", topK}});
  call.input(DType::F32, logitsShape, std::vector<float>(elementCount(logitsShape)));
  call.input(DType::F32, scaleShape, std::vector<float>(elementCount(scaleShape)));
  call.output(DType::F32, weightsShape).output(DType::I64, {3, 2});
  return call;
}

TEST(MoeRouteKernel, FactoryRejectsBadSignatures) {
  EXPECT_NO_THROW(routeCall(2).create());
  EXPECT_EQ(factoryError(routeCall(5)), "step 0 (moe_route): attribute 'top_k': 5 is outside [1, E = 4]");
  EXPECT_EQ(factoryError(routeCall(0)), "step 0 (moe_route): attribute 'top_k': 0 is outside [1, E = 4]");
  EXPECT_EQ(factoryError(routeCall(2, {3, 4}, {3})),
            "step 0 (moe_route): input per_expert_scale has shape [3], expected [4]");
  EXPECT_EQ(factoryError(routeCall(2, {3, 4}, {4}, {3, 3})),
            "step 0 (moe_route): output weights has shape [3,3], expected [3,2]");
  EXPECT_EQ(factoryError(routeCall(2, {12}, {4})), "step 0 (moe_route): input logits has shape [12], expected [N, E]");
}

// ---------------------------------------------------------------------------------------------
// moe_experts

struct ExpertsCase {
  int64_t tokens = 7, hidden = 6, topK = 2, experts = 4, expertHidden = 5;
  std::vector<int64_t> indices;  // [tokens, topK]
};

struct ExpertsInputs {
  std::vector<double> x, weights, gateUp, down;
};

ExpertsInputs randomExpertsInputs(const ExpertsCase& c, uint32_t seed) {
  return {randomValues<double>(c.tokens * c.hidden, seed, -1, 1),
          randomValues<double>(c.tokens * c.topK, seed + 1, -0.5, 1),
          randomValues<double>(c.experts * 2 * c.expertHidden * c.hidden, seed + 2, -0.7, 0.7),
          randomValues<double>(c.experts * c.hidden * c.expertHidden, seed + 3, -0.7, 0.7)};
}

double geluTanhReference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// Token by token, route by route: the expert's gated MLP on the token's row, weighted and summed.
template <typename T>
std::vector<double> expertsReference(const ExpertsCase& c, const std::vector<T>& x, const std::vector<T>& weights,
                                     const std::vector<T>& gateUp, const std::vector<T>& down) {
  const int64_t H = c.hidden, I = c.expertHidden;
  std::vector<double> y(c.tokens * H, 0.0);
  for (int64_t n = 0; n < c.tokens; ++n)
    for (int64_t j = 0; j < c.topK; ++j) {
      const int64_t e = c.indices[n * c.topK + j];
      std::vector<double> activation(I);
      for (int64_t i = 0; i < I; ++i) {
        double gate = 0, up = 0;
        for (int64_t h = 0; h < H; ++h) {
          gate += static_cast<double>(x[n * H + h]) * gateUp[(e * 2 * I + i) * H + h];
          up += static_cast<double>(x[n * H + h]) * gateUp[(e * 2 * I + I + i) * H + h];
        }
        activation[i] = geluTanhReference(gate) * up;
      }
      for (int64_t h = 0; h < H; ++h) {
        double output = 0;
        for (int64_t i = 0; i < I; ++i) output += activation[i] * down[(e * H + h) * I + i];
        y[n * H + h] += weights[n * c.topK + j] * output;
      }
    }
  return y;
}

template <typename T>
std::vector<T> runExperts(DType dtype, const ExpertsCase& c, const std::vector<T>& x, const std::vector<T>& weights,
                          const std::vector<T>& gateUp, const std::vector<T>& down, ThreadPool* threads = nullptr) {
  KernelCall call("moe_experts", {{"expert_offset", 0}});
  call.input(dtype, {c.tokens, c.hidden}, x).input(dtype, {c.tokens, c.topK}, weights);
  call.input(DType::I64, {c.tokens, c.topK}, c.indices);
  call.input(dtype, {c.experts, 2 * c.expertHidden, c.hidden}, gateUp);
  call.input(dtype, {c.experts, c.hidden, c.expertHidden}, down);
  call.output(dtype, {c.tokens, c.hidden});
  call.run(threads);
  return call.result<T>();
}

template <typename T>
std::vector<T> as(const std::vector<double>& values) {
  return std::vector<T>(values.begin(), values.end());
}

void checkExperts(const ExpertsCase& c, uint32_t seed, ThreadPool* threads = nullptr) {
  const ExpertsInputs in = randomExpertsInputs(c, seed);
  expectClose(runExperts(DType::F64, c, in.x, in.weights, in.gateUp, in.down, threads),
              expertsReference(c, in.x, in.weights, in.gateUp, in.down), 1e-12);
  const std::vector<float> x = as<float>(in.x), weights = as<float>(in.weights), gateUp = as<float>(in.gateUp),
                           down = as<float>(in.down);
  expectClose(runExperts(DType::F32, c, x, weights, gateUp, down, threads),
              expertsReference(c, x, weights, gateUp, down), 1e-5);
}

TEST(MoeExpertsKernel, EveryExpertUsed) {
  // Token 6 routes to expert 2 twice: the contract does not require distinct experts per token.
  checkExperts({.indices = {0, 1, 2, 3, 1, 0, 3, 2, 0, 3, 1, 0, 2, 2}}, 101);
}

TEST(MoeExpertsKernel, SomeExpertsUnused) {
  checkExperts({.tokens = 5, .experts = 6, .indices = {4, 1, 1, 4, 4, 1, 1, 4, 4, 1}}, 102);
  checkExperts({.tokens = 3, .topK = 1, .experts = 5, .indices = {3, 3, 3}}, 103);
}

TEST(MoeExpertsKernel, TopKOfAllExperts) {
  checkExperts({.tokens = 4, .topK = 3, .experts = 3, .indices = {0, 1, 2, 2, 0, 1, 1, 2, 0, 2, 1, 0}}, 104);
}

TEST(MoeExpertsKernel, ManyTokensAcrossThreadsGiveTheSerialResult) {
  ExpertsCase c{.tokens = 200, .hidden = 24, .topK = 3, .experts = 8, .expertHidden = 16};
  for (int64_t route = 0; route < c.tokens * c.topK; ++route) c.indices.push_back((route * 5 + route / 7) % 8);
  ThreadPool threads(2);
  checkExperts(c, 105, &threads);
  const ExpertsInputs in = randomExpertsInputs(c, 106);
  const std::vector<float> x = as<float>(in.x), w = as<float>(in.weights), gu = as<float>(in.gateUp),
                           d = as<float>(in.down);
  EXPECT_EQ(runExperts(DType::F32, c, x, w, gu, d, &threads), runExperts(DType::F32, c, x, w, gu, d));
}

TEST(MoeExpertsKernel, NegativeIndexIsARunTimeErrorNamingIt) {
  const ExpertsCase c{.tokens = 3, .indices = {0, 1, 2, -1, 3, 0}};
  const ExpertsInputs in = randomExpertsInputs(c, 107);
  try {
    runExperts(DType::F64, c, in.x, in.weights, in.gateUp, in.down);
    ADD_FAILURE() << "index -1 was accepted";
  } catch (const RuntimeError& error) {
    EXPECT_EQ(error.exitCode(), 1);
    EXPECT_EQ(std::string(error.what()), "step 0 (moe_experts): expert index -1 at indices[1, 1] is negative, not an expert");
  }
}

// ---------------------------------------------------------------------------------------------
// Blocks of experts (expert parallelism): gate_up and down hold the global experts
// [expert_offset, expert_offset + E), and each block's results summed over the blocks are the whole op's.

// The experts [first, first + count) of gate_up [E, 2I, H] or down [E, H, I], `perExpert` values each.
std::vector<double> expertBlock(const std::vector<double>& all, int64_t perExpert, int64_t first, int64_t count) {
  return std::vector<double>(all.begin() + first * perExpert, all.begin() + (first + count) * perExpert);
}

struct ExpertsGradients {
  std::vector<double> dx, dWeights, dGateUp, dDown;
};

// moe_experts_backward in f64 over the block [expertOffset, expertOffset + experts) of the inputs'
// experts (c.experts of them).
ExpertsGradients runExpertsBackward(const ExpertsCase& c, const ExpertsInputs& in, const std::vector<double>& dy,
                                    int64_t expertOffset, int64_t experts) {
  const int64_t gateUpSize = 2 * c.expertHidden * c.hidden, downSize = c.hidden * c.expertHidden;
  KernelCall call("moe_experts_backward", {{"expert_offset", expertOffset}});
  call.input(DType::F64, {c.tokens, c.hidden}, in.x).input(DType::F64, {c.tokens, c.topK}, in.weights);
  call.input(DType::I64, {c.tokens, c.topK}, c.indices);
  call.input(DType::F64, {experts, 2 * c.expertHidden, c.hidden}, expertBlock(in.gateUp, gateUpSize, expertOffset, experts));
  call.input(DType::F64, {experts, c.hidden, c.expertHidden}, expertBlock(in.down, downSize, expertOffset, experts));
  call.input(DType::F64, {c.tokens, c.hidden}, dy);
  call.output(DType::F64, {c.tokens, c.hidden}).output(DType::F64, {c.tokens, c.topK});
  call.output(DType::F64, {experts, 2 * c.expertHidden, c.hidden}).output(DType::F64, {experts, c.hidden, c.expertHidden});
  call.run();
  return {call.result<double>(0), call.result<double>(1), call.result<double>(2), call.result<double>(3)};
}

std::vector<double> runExpertsBlock(const ExpertsCase& c, const ExpertsInputs& in, int64_t expertOffset, int64_t experts) {
  const int64_t gateUpSize = 2 * c.expertHidden * c.hidden, downSize = c.hidden * c.expertHidden;
  KernelCall call("moe_experts", {{"expert_offset", expertOffset}});
  call.input(DType::F64, {c.tokens, c.hidden}, in.x).input(DType::F64, {c.tokens, c.topK}, in.weights);
  call.input(DType::I64, {c.tokens, c.topK}, c.indices);
  call.input(DType::F64, {experts, 2 * c.expertHidden, c.hidden}, expertBlock(in.gateUp, gateUpSize, expertOffset, experts));
  call.input(DType::F64, {experts, c.hidden, c.expertHidden}, expertBlock(in.down, downSize, expertOffset, experts));
  call.output(DType::F64, {c.tokens, c.hidden});
  call.run();
  return call.result<double>();
}

std::vector<double> sumOf(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> sum(a.size());
  for (size_t i = 0; i < a.size(); ++i) sum[i] = a[i] + b[i];
  return sum;
}

std::vector<double> concatenated(std::vector<double> a, const std::vector<double>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Five experts cut unevenly into [0, 2) and [2, 5); token 1 routes to the first block only, token 3 to
// the second only, and token 5 to expert 4 twice.
const ExpertsCase kBlockCase{.tokens = 6, .experts = 5, .indices = {0, 3, 1, 0, 4, 2, 2, 4, 1, 3, 4, 4}};

TEST(MoeExpertsKernel, BlocksOfExpertsSumToTheWholeOp) {
  const ExpertsCase& c = kBlockCase;
  const ExpertsInputs in = randomExpertsInputs(c, 108);
  const std::vector<double> whole = runExpertsBlock(c, in, 0, 5);
  expectClose(whole, expertsReference(c, in.x, in.weights, in.gateUp, in.down), 1e-12);
  const std::vector<double> low = runExpertsBlock(c, in, 0, 2), high = runExpertsBlock(c, in, 2, 3);
  expectClose(sumOf(low, high), whole, 1e-12);
  // Token 3 routes to experts 2 and 4 only: the first block adds nothing to it.
  EXPECT_EQ(std::vector<double>(low.begin() + 3 * c.hidden, low.begin() + 4 * c.hidden), std::vector<double>(c.hidden, 0.0));
}

TEST(MoeExpertsBackwardKernel, BlocksOfExpertsSumToTheWholeGradients) {
  const ExpertsCase& c = kBlockCase;
  const ExpertsInputs in = randomExpertsInputs(c, 109);
  const std::vector<double> dy = randomValues<double>(c.tokens * c.hidden, 110, -1, 1);
  const ExpertsGradients whole = runExpertsBackward(c, in, dy, 0, 5);
  const ExpertsGradients low = runExpertsBackward(c, in, dy, 0, 2), high = runExpertsBackward(c, in, dy, 2, 3);
  expectClose(sumOf(low.dx, high.dx), whole.dx, 1e-12);
  // Each route's weight gradient comes from the one block holding its expert; the other gives 0.
  expectClose(sumOf(low.dWeights, high.dWeights), whole.dWeights, 1e-12);
  for (int64_t route = 0; route < c.tokens * c.topK; ++route) {
    const bool inLow = c.indices[route] < 2;
    EXPECT_EQ((inLow ? high : low).dWeights[route], 0.0) << "route " << route;
  }
  // The experts' gradients are the whole op's, block by block.
  expectClose(concatenated(low.dGateUp, high.dGateUp), whole.dGateUp, 1e-12);
  expectClose(concatenated(low.dDown, high.dDown), whole.dDown, 1e-12);
}

// Products large enough that the experts run side by side on the pool (over 2^21 multiply-adds in
// all), unevenly loaded, with OpenBLAS left to its own thread count: each kernel runs its experts'
// products single-threaded whoever runs them, so pools of 2 and 3 threads give the serial bytes.
// Expert 7 is unused: its weight gradients are zeros (the outputs start as 0xCD bytes).
TEST(MoeExpertsKernels, ExpertsSideBySideGiveTheSerialBytes) {
  ExpertsCase c{.tokens = 300, .hidden = 64, .topK = 2, .experts = 8, .expertHidden = 48};
  for (int64_t route = 0; route < c.tokens * c.topK; ++route)
    c.indices.push_back(route % 3 == 0 ? 5 : (route * 5 + route / 7) % 7);
  const ExpertsInputs in = randomExpertsInputs(c, 111);
  const std::vector<float> x = as<float>(in.x), w = as<float>(in.weights), gu = as<float>(in.gateUp),
                           d = as<float>(in.down), dy = as<float>(randomValues<double>(c.tokens * c.hidden, 112, -1, 1));
  auto backward = [&](ThreadPool* threads) {
    KernelCall call("moe_experts_backward", {{"expert_offset", 0}});
    call.input(DType::F32, {c.tokens, c.hidden}, x).input(DType::F32, {c.tokens, c.topK}, w);
    call.input(DType::I64, {c.tokens, c.topK}, c.indices);
    call.input(DType::F32, {c.experts, 2 * c.expertHidden, c.hidden}, gu);
    call.input(DType::F32, {c.experts, c.hidden, c.expertHidden}, d);
    call.input(DType::F32, {c.tokens, c.hidden}, dy);
    call.output(DType::F32, {c.tokens, c.hidden}).output(DType::F32, {c.tokens, c.topK});
    call.output(DType::F32, {c.experts, 2 * c.expertHidden, c.hidden}).output(DType::F32, {c.experts, c.hidden, c.expertHidden});
    call.run(threads);
    return std::vector<std::vector<float>>{call.result<float>(0), call.result<float>(1), call.result<float>(2),
                                           call.result<float>(3)};
  };
  const std::vector<float> serial = runExperts(DType::F32, c, x, w, gu, d);
  expectClose(serial, expertsReference(c, x, w, gu, d), 1e-5);
  const std::vector<std::vector<float>> serialGradients = backward(nullptr);
  const int64_t gateUpBlock = 2 * c.expertHidden * c.hidden, downBlock = c.hidden * c.expertHidden;
  EXPECT_EQ(std::vector<float>(serialGradients[2].end() - gateUpBlock, serialGradients[2].end()),
            std::vector<float>(gateUpBlock, 0.0f));
  EXPECT_EQ(std::vector<float>(serialGradients[3].end() - downBlock, serialGradients[3].end()),
            std::vector<float>(downBlock, 0.0f));
  EXPECT_NE(serialGradients[3][0], 0.0f);  // expert 0's, written by its product
  ThreadPool two(2), three(3);
  for (ThreadPool* threads : {&two, &three}) {
    SCOPED_TRACE(::testing::Message() << threads->size() << " threads");
    EXPECT_EQ(runExperts(DType::F32, c, x, w, gu, d, threads), serial);
    EXPECT_EQ(backward(threads), serialGradients);
  }
}

// ---------------------------------------------------------------------------------------------
// gate_up_rows: moe_experts' optional output 1 keeps each route's gate/up pre-activations, and
// moe_experts_backward's optional input 6 reads them instead of recomputing the gate/up product.

// The inputs of moe_experts (op "moe_experts") or its backward over the block [expertOffset,
// expertOffset + experts) of the case's experts, in T, with the backward's dy.
template <typename T>
KernelCall expertsBlockCall(const std::string& op, DType dtype, const ExpertsCase& c, const ExpertsInputs& in,
                            int64_t expertOffset, int64_t experts) {
  const int64_t gateUpSize = 2 * c.expertHidden * c.hidden, downSize = c.hidden * c.expertHidden;
  KernelCall call(op, {{"expert_offset", expertOffset}});
  call.input(dtype, {c.tokens, c.hidden}, as<T>(in.x)).input(dtype, {c.tokens, c.topK}, as<T>(in.weights));
  call.input(DType::I64, {c.tokens, c.topK}, c.indices);
  call.input(dtype, {experts, 2 * c.expertHidden, c.hidden}, as<T>(expertBlock(in.gateUp, gateUpSize, expertOffset, experts)));
  call.input(dtype, {experts, c.hidden, c.expertHidden}, as<T>(expertBlock(in.down, downSize, expertOffset, experts)));
  return call;
}

template <typename T>
struct ForwardResults {
  std::vector<T> y, gateUpRows;  // gateUpRows empty when not asked for
};

template <typename T>
ForwardResults<T> runExpertsForward(DType dtype, const ExpertsCase& c, const ExpertsInputs& in, int64_t expertOffset,
                                    int64_t experts, bool keepRows, ThreadPool* threads = nullptr) {
  KernelCall call = expertsBlockCall<T>("moe_experts", dtype, c, in, expertOffset, experts);
  call.output(dtype, {c.tokens, c.hidden});
  if (keepRows) call.output(dtype, {c.tokens * c.topK, 2 * c.expertHidden});
  call.run(threads);
  return {call.result<T>(0), keepRows ? call.result<T>(1) : std::vector<T>{}};
}

// dx, dweights, dgate_up, ddown; reading `gateUpRows` (input 6) when it is not empty.
template <typename T>
std::vector<std::vector<T>> runExpertsBackwardOf(DType dtype, const ExpertsCase& c, const ExpertsInputs& in,
                                                 const std::vector<double>& dy, int64_t expertOffset, int64_t experts,
                                                 const std::vector<T>& gateUpRows, ThreadPool* threads = nullptr) {
  KernelCall call = expertsBlockCall<T>("moe_experts_backward", dtype, c, in, expertOffset, experts);
  call.input(dtype, {c.tokens, c.hidden}, as<T>(dy));
  if (!gateUpRows.empty()) call.input(dtype, {c.tokens * c.topK, 2 * c.expertHidden}, gateUpRows);
  call.output(dtype, {c.tokens, c.hidden}).output(dtype, {c.tokens, c.topK});
  call.output(dtype, {experts, 2 * c.expertHidden, c.hidden}).output(dtype, {experts, c.hidden, c.expertHidden});
  call.run(threads);
  return {call.result<T>(0), call.result<T>(1), call.result<T>(2), call.result<T>(3)};
}

// Route by route in double from the T-rounded inputs: [x[n] · G_eᵀ | x[n] · U_eᵀ] for a route to an
// expert of the block [expertOffset, expertOffset + experts), a zero row for any other.
template <typename T>
std::vector<double> gateUpRowsReference(const ExpertsCase& c, const ExpertsInputs& in, int64_t expertOffset,
                                        int64_t experts) {
  const int64_t H = c.hidden, W = 2 * c.expertHidden;
  const std::vector<T> x = as<T>(in.x), gateUp = as<T>(in.gateUp);
  std::vector<double> rows(c.tokens * c.topK * W, 0.0);
  for (int64_t route = 0; route < c.tokens * c.topK; ++route) {
    const int64_t e = c.indices[route], n = route / c.topK;
    if (e < expertOffset || e >= expertOffset + experts) continue;
    for (int64_t column = 0; column < W; ++column) {
      double sum = 0;
      for (int64_t h = 0; h < H; ++h) sum += static_cast<double>(x[n * H + h]) * gateUp[(e * W + column) * H + h];
      rows[route * W + column] = sum;
    }
  }
  return rows;
}

// kBlockCase's experts whole and cut into [0, 2) and [2, 5): each route's row is its pre-activations
// or, for a route to the other block's expert, zeros (the output starts as 0xCD bytes); y is the
// same bytes as without the second output.
template <typename T>
void checkKeptRows(DType dtype, double tolerance) {
  const ExpertsCase& c = kBlockCase;
  const ExpertsInputs in = randomExpertsInputs(c, 113);
  const int64_t W = 2 * c.expertHidden;
  const std::pair<int64_t, int64_t> blocks[] = {{0, 5}, {0, 2}, {2, 3}};  // (expert_offset, E)
  for (const auto& [offset, experts] : blocks) {
    SCOPED_TRACE(::testing::Message() << "experts [" << offset << ", " << offset + experts << ")");
    const ForwardResults<T> kept = runExpertsForward<T>(dtype, c, in, offset, experts, true);
    const std::vector<double> expected = gateUpRowsReference<T>(c, in, offset, experts);
    ASSERT_EQ(kept.gateUpRows.size(), expected.size());
    for (int64_t route = 0; route < c.tokens * c.topK; ++route) {
      SCOPED_TRACE(::testing::Message() << "route " << route);
      const std::vector<T> row(kept.gateUpRows.begin() + route * W, kept.gateUpRows.begin() + (route + 1) * W);
      const bool held = c.indices[route] >= offset && c.indices[route] < offset + experts;
      if (held)
        expectClose(row, std::vector<double>(expected.begin() + route * W, expected.begin() + (route + 1) * W), tolerance);
      else
        EXPECT_EQ(row, std::vector<T>(W, T(0)));
    }
    EXPECT_EQ(kept.y, runExpertsForward<T>(dtype, c, in, offset, experts, false).y);
  }
}

TEST(MoeExpertsKernel, KeptGateUpRowsAreEachRoutesPreActivations) {
  checkKeptRows<double>(DType::F64, 1e-12);
  checkKeptRows<float>(DType::F32, 1e-5);
}

// With H = 0 every pre-activation is an empty sum: zero rows (the output starts as 0xCD bytes).
TEST(MoeExpertsKernel, KeptGateUpRowsOfAnEmptyHiddenSizeAreZero) {
  const ExpertsCase c{.tokens = 3, .hidden = 0, .topK = 2, .experts = 2, .expertHidden = 3, .indices = {0, 1, 1, 1, 0, 0}};
  const ExpertsInputs in = randomExpertsInputs(c, 116);
  EXPECT_EQ(runExpertsForward<float>(DType::F32, c, in, 0, 2, true).gateUpRows, std::vector<float>(6 * 6, 0.0f));
}

// The backward reading the forward's rows gives the bytes of the backward recomputing them: small
// blocks of experts, and products large enough to run the experts side by side on pools of 2 and 3
// threads (expert 7 unused), whole and as the block [3, 8).
template <typename T>
void checkBackwardReadingKeptRows(DType dtype) {
  ExpertsCase large{.tokens = 300, .hidden = 64, .topK = 2, .experts = 8, .expertHidden = 48};
  for (int64_t route = 0; route < large.tokens * large.topK; ++route)
    large.indices.push_back(route % 3 == 0 ? 5 : (route * 5 + route / 7) % 7);
  struct Block {
    const ExpertsCase* c;
    int64_t offset, experts;
  };
  const Block blocks[] = {{&kBlockCase, 0, 5}, {&kBlockCase, 0, 2}, {&kBlockCase, 2, 3}, {&large, 0, 8}, {&large, 3, 5}};
  ThreadPool two(2), three(3);
  for (const Block& block : blocks) {
    const ExpertsCase& c = *block.c;
    SCOPED_TRACE(::testing::Message() << c.tokens << " tokens, experts [" << block.offset << ", "
                                      << block.offset + block.experts << ")");
    const ExpertsInputs in = randomExpertsInputs(c, 114);
    const std::vector<double> dy = randomValues<double>(c.tokens * c.hidden, 115, -1, 1);
    const std::vector<std::vector<T>> recomputed =
        runExpertsBackwardOf<T>(dtype, c, in, dy, block.offset, block.experts, std::vector<T>{});
    for (ThreadPool* threads : {static_cast<ThreadPool*>(nullptr), &two, &three}) {
      SCOPED_TRACE(::testing::Message() << (threads == nullptr ? 0 : threads->size()) << " threads");
      const std::vector<T> rows = runExpertsForward<T>(dtype, c, in, block.offset, block.experts, true, threads).gateUpRows;
      EXPECT_EQ(runExpertsBackwardOf<T>(dtype, c, in, dy, block.offset, block.experts, rows, threads), recomputed);
    }
  }
}

TEST(MoeExpertsBackwardKernel, ReadingTheKeptRowsGivesTheRecomputedBytes) {
  checkBackwardReadingKeptRows<double>(DType::F64);
  checkBackwardReadingKeptRows<float>(DType::F32);
}

KernelCall expertsCall(std::vector<int64_t> xShape, std::vector<int64_t> weightsShape,
                       std::vector<int64_t> indicesShape, std::vector<int64_t> gateUpShape,
                       std::vector<int64_t> downShape, std::vector<int64_t> yShape,
                       nlohmann::json attrs = {{"expert_offset", 0}}) {
  KernelCall call("moe_experts", std::move(attrs));
  call.input(DType::F32, xShape, std::vector<float>(elementCount(xShape)));
  call.input(DType::F32, weightsShape, std::vector<float>(elementCount(weightsShape)));
  call.input(DType::I64, indicesShape, std::vector<int64_t>(elementCount(indicesShape)));
  call.input(DType::F32, gateUpShape, std::vector<float>(elementCount(gateUpShape)));
  call.input(DType::F32, downShape, std::vector<float>(elementCount(downShape)));
  call.output(DType::F32, yShape);
  return call;
}

TEST(MoeExpertsKernel, FactoryRejectsBadShapes) {
  // x [3, 6], weights and indices [3, 2], gate_up [4, 10, 6], down [4, 6, 5], y [3, 6] is accepted.
  EXPECT_NO_THROW(expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 10, 6}, {4, 6, 5}, {3, 6}).create());
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 10, 5}, {4, 6, 5}, {3, 6})),
            "step 0 (moe_experts): input gate_up has shape [4,10,5], expected [4,10,6]");
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 9, 6}, {4, 6, 5}, {3, 6})),
            "step 0 (moe_experts): input gate_up has shape [4,9,6]: an odd middle dim cannot hold a gate block and "
            "an up block of I rows each");
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 10, 6}, {4, 5, 6}, {3, 6})),
            "step 0 (moe_experts): input down has shape [4,5,6], expected [4,6,5]");
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {3, 2}, {3, 1}, {4, 10, 6}, {4, 6, 5}, {3, 6})),
            "step 0 (moe_experts): input indices has shape [3,1], expected [3,2]");
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {2, 2}, {2, 2}, {4, 10, 6}, {4, 6, 5}, {3, 6})),
            "step 0 (moe_experts): input weights has shape [2,2], expected [3,2]");
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 10, 6}, {4, 6, 5}, {3, 5})),
            "step 0 (moe_experts): output y has shape [3,5], expected [3,6]");
  EXPECT_EQ(factoryError(expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 10, 6}, {4, 6, 5}, {3, 6}, {{"expert_offset", -1}})), "step 0 (moe_experts): attribute 'expert_offset': -1 must be >= 0");
}

// The forward with gate_up_rows of `rowsShape` and `rowsDType`, the accepted shapes otherwise
// (x [3, 6], k = 2, gate_up [4, 10, 6]: gate_up_rows [6, 10]).
KernelCall expertsKeepingCall(std::vector<int64_t> rowsShape, DType rowsDType = DType::F32) {
  KernelCall call = expertsCall({3, 6}, {3, 2}, {3, 2}, {4, 10, 6}, {4, 6, 5}, {3, 6});
  call.output(rowsDType, std::move(rowsShape));
  return call;
}

// The backward with input 6 of `rowsShape` and `rowsDType`, the same accepted shapes.
KernelCall expertsBackwardReadingCall(std::vector<int64_t> rowsShape, DType rowsDType = DType::F32) {
  KernelCall call("moe_experts_backward", {{"expert_offset", 0}});
  call.input(DType::F32, {3, 6}, std::vector<float>(18)).input(DType::F32, {3, 2}, std::vector<float>(6));
  call.input(DType::I64, {3, 2}, std::vector<int64_t>(6));
  call.input(DType::F32, {4, 10, 6}, std::vector<float>(240)).input(DType::F32, {4, 6, 5}, std::vector<float>(120));
  call.input(DType::F32, {3, 6}, std::vector<float>(18));
  const size_t rowElements = elementCount(rowsShape);
  if (rowsDType == DType::F64)
    call.input(rowsDType, rowsShape, std::vector<double>(rowElements));
  else
    call.input(rowsDType, rowsShape, std::vector<float>(rowElements));
  call.output(DType::F32, {3, 6}).output(DType::F32, {3, 2}).output(DType::F32, {4, 10, 6}).output(DType::F32, {4, 6, 5});
  return call;
}

TEST(MoeExpertsKernels, FactoriesCheckGateUpRows) {
  EXPECT_NO_THROW(expertsKeepingCall({6, 10}).create());
  EXPECT_EQ(factoryError(expertsKeepingCall({3, 10})),
            "step 0 (moe_experts): output gate_up_rows has shape [3,10], expected [6,10]");
  EXPECT_EQ(factoryError(expertsKeepingCall({6, 5})),
            "step 0 (moe_experts): output gate_up_rows has shape [6,5], expected [6,10]");
  EXPECT_EQ(factoryError(expertsKeepingCall({6, 10}, DType::F64)),
            "step 0 (moe_experts): output gate_up_rows has dtype f64, expected f32");
  KernelCall threeOutputs = expertsKeepingCall({6, 10});
  threeOutputs.output(DType::F32, {6, 10});
  EXPECT_EQ(factoryError(threeOutputs),
            "step 0 (moe_experts): expected 5 inputs and 1 or 2 outputs (y, optionally gate_up_rows), got 5 inputs "
            "and 3 outputs");

  EXPECT_NO_THROW(expertsBackwardReadingCall({6, 10}).create());
  EXPECT_EQ(factoryError(expertsBackwardReadingCall({6, 10, 1})),
            "step 0 (moe_experts_backward): input gate_up_rows has shape [6,10,1], expected [6,10]");
  EXPECT_EQ(factoryError(expertsBackwardReadingCall({3, 20})),
            "step 0 (moe_experts_backward): input gate_up_rows has shape [3,20], expected [6,10]");
  EXPECT_EQ(factoryError(expertsBackwardReadingCall({6, 10}, DType::F64)),
            "step 0 (moe_experts_backward): input gate_up_rows has dtype f64, expected f32");
}

}  // namespace
}  // namespace dgemma::test
