// runtime/kernels/moe/ExpertsMath.h: the CUDA moe_experts and moe_experts_backward (moe/experts.cu)
// run on the host step by step (the grouping, each element kernel's body over all its elements, and
// the per-expert GEMMs as plain loops) against the CPU kernels, with repeated experts, a block of
// the experts (expert_offset; routes to other blocks), and an unused expert. Tolerance 2e-5 of
// max(1, |cpu|): the same f32 operations in other summation orders (BLAS against plain loops) and
// libm's tanhf against the CPU's fastTanh.
#include "KernelTestSupport.h"
#include "runtime/kernels/moe/ExpertsMath.h"

namespace dgemma::test {
namespace {

using moe_experts::RouteGroups;

// Row-major C[m, n] = op(A) op(B), f32 sums in k order.
void hostGemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
              const float* b, int64_t ldb, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      float sum = 0;
      for (int64_t p = 0; p < k; ++p)
        sum += (transposeA ? a[p * lda + i] : a[i * lda + p]) * (transposeB ? b[j * ldb + p] : b[p * ldb + j]);
      c[i * ldc + j] = sum;
    }
}

struct Geometry {
  int64_t tokens, hidden, topK, experts, inner, offset;
  std::vector<int64_t> indices;  // global expert ids
};

template <typename Body>
void forEachUsedExpert(const RouteGroups& groups, int64_t experts, Body&& body) {
  for (int64_t e = 0; e < experts; ++e)
    if (const int64_t rows = groups.firstSlot[e + 1] - groups.firstSlot[e]; rows > 0) body(e, groups.firstSlot[e], rows);
}

std::vector<float> emulateForward(const Geometry& g, const std::vector<float>& x, const std::vector<float>& weights,
                                  const std::vector<float>& gateUp, const std::vector<float>& down) {
  const RouteGroups groups = moe_experts::groupRoutes(g.indices.data(), g.tokens, g.topK, g.experts, g.offset);
  const int64_t slots = groups.slots(), width = 2 * g.inner;
  std::vector<float> input(slots * g.hidden), gateUpOutput(slots * width), expertOutput(slots * g.hidden),
      y(g.tokens * g.hidden);
  for (int64_t e = 0; e < slots * g.hidden; ++e)
    moe_experts::gatherElement(x.data(), groups.tokenOfSlot.data(), input.data(), g.hidden, e);
  forEachUsedExpert(groups, g.experts, [&](int64_t e, int64_t first, int64_t rows) {
    hostGemm(false, true, rows, width, g.hidden, input.data() + first * g.hidden, g.hidden,
             gateUp.data() + e * width * g.hidden, g.hidden, gateUpOutput.data() + first * width, width);
  });
  for (int64_t e = 0; e < slots * g.inner; ++e) moe_experts::gatedGeluElement(gateUpOutput.data(), g.inner, e);
  forEachUsedExpert(groups, g.experts, [&](int64_t e, int64_t first, int64_t rows) {
    hostGemm(false, true, rows, g.hidden, g.inner, gateUpOutput.data() + first * width, width,
             down.data() + e * g.hidden * g.inner, g.inner, expertOutput.data() + first * g.hidden, g.hidden);
  });
  for (int64_t e = 0; e < g.tokens * g.hidden; ++e)
    moe_experts::combineElement(expertOutput.data(), weights.data(), groups.slotOfRoute.data(), y.data(), g.topK,
                                g.hidden, e);
  return y;
}

struct Gradients {
  std::vector<float> dx, dWeights, dGateUp, dDown;
};

Gradients emulateBackward(const Geometry& g, const std::vector<float>& x, const std::vector<float>& weights,
                          const std::vector<float>& gateUp, const std::vector<float>& down, const std::vector<float>& dy) {
  const RouteGroups groups = moe_experts::groupRoutes(g.indices.data(), g.tokens, g.topK, g.experts, g.offset);
  const int64_t slots = groups.slots(), width = 2 * g.inner, hidden = g.hidden, inner = g.inner;
  Gradients out{std::vector<float>(g.tokens * hidden), std::vector<float>(g.tokens * g.topK),
                std::vector<float>(g.experts * width * hidden), std::vector<float>(g.experts * hidden * inner)};
  std::vector<float> input(slots * hidden), dOutput(slots * hidden), dInput(slots * hidden), gateUpOutput(slots * width),
      dGateUpOutput(slots * width), hiddenState(slots * inner), weightedHidden(slots * inner), dOutputDown(slots * inner);
  for (int64_t e = 0; e < slots * hidden; ++e) {
    moe_experts::gatherElement(x.data(), groups.tokenOfSlot.data(), input.data(), hidden, e);
    moe_experts::gatherElement(dy.data(), groups.tokenOfSlot.data(), dOutput.data(), hidden, e);
  }
  forEachUsedExpert(groups, g.experts, [&](int64_t e, int64_t first, int64_t rows) {
    hostGemm(false, true, rows, width, hidden, input.data() + first * hidden, hidden, gateUp.data() + e * width * hidden,
             hidden, gateUpOutput.data() + first * width, width);
  });
  for (int64_t e = 0; e < slots * inner; ++e)
    moe_experts::gatedGeluWeightedElement(gateUpOutput.data(), weights.data(), groups.routeOfSlot.data(),
                                          hiddenState.data(), weightedHidden.data(), inner, e);
  forEachUsedExpert(groups, g.experts, [&](int64_t e, int64_t first, int64_t rows) {
    hostGemm(true, false, hidden, inner, rows, dOutput.data() + first * hidden, hidden, weightedHidden.data() + first * inner,
             inner, out.dDown.data() + e * hidden * inner, inner);
    hostGemm(false, false, rows, inner, hidden, dOutput.data() + first * hidden, hidden, down.data() + e * hidden * inner,
             inner, dOutputDown.data() + first * inner, inner);
  });
  for (int64_t route = 0; route < g.tokens * g.topK; ++route)
    moe_experts::routeWeightGradient(hiddenState.data(), dOutputDown.data(), groups.slotOfRoute.data(),
                                     out.dWeights.data(), inner, route);
  for (int64_t e = 0; e < slots * inner; ++e)
    moe_experts::gatedGeluBackwardElement(gateUpOutput.data(), dOutputDown.data(), weights.data(),
                                          groups.routeOfSlot.data(), dGateUpOutput.data(), inner, e);
  forEachUsedExpert(groups, g.experts, [&](int64_t e, int64_t first, int64_t rows) {
    hostGemm(true, false, width, hidden, rows, dGateUpOutput.data() + first * width, width, input.data() + first * hidden,
             hidden, out.dGateUp.data() + e * width * hidden, hidden);
    hostGemm(false, false, rows, hidden, width, dGateUpOutput.data() + first * width, width,
             gateUp.data() + e * width * hidden, hidden, dInput.data() + first * hidden, hidden);
  });
  for (int64_t e = 0; e < g.tokens * hidden; ++e)
    moe_experts::inputGradientElement(dInput.data(), groups.slotOfRoute.data(), out.dx.data(), g.topK, hidden, e);
  return out;
}

void expectNear(const std::vector<float>& emulated, const std::vector<float>& cpu, const std::string& what) {
  ASSERT_EQ(emulated.size(), cpu.size()) << what;
  for (size_t i = 0; i < cpu.size(); ++i)
    ASSERT_NEAR(emulated[i], cpu[i], 2e-5 * std::max(1.0f, std::fabs(cpu[i]))) << what << " at " << i;
}

std::vector<Geometry> geometries() {
  // Repeated experts in a token, expert 3 unused (first case); a block [2, 5) of 8 experts with
  // routes to other blocks (second); one expert, k = 1 (third).
  return {{5, 12, 3, 4, 7, 0, {0, 1, 0, 2, 2, 1, 1, 0, 2, 0, 0, 0, 2, 1, 0}},
          {6, 8, 2, 3, 5, 2, {0, 2, 3, 7, 4, 4, 1, 5, 2, 6, 3, 2}},
          {4, 16, 1, 1, 9, 0, {0, 0, 0, 0}}};
}

TEST(MoeExpertsMath, GroupingSortsRoutesByExpertInTokenOrder) {
  const std::vector<int64_t> indices = {3, 1, 1, 3, 0, 1};  // 3 tokens, k = 2; a block [1, 3) of experts
  const RouteGroups groups = moe_experts::groupRoutes(indices.data(), 3, 2, 2, 1);
  EXPECT_EQ(groups.firstSlot, (std::vector<int64_t>{0, 3, 3}));  // expert 1: three routes, expert 2: none
  EXPECT_EQ(groups.routeOfSlot, (std::vector<int64_t>{1, 2, 5}));
  EXPECT_EQ(groups.tokenOfSlot, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(groups.slotOfRoute, (std::vector<int64_t>{-1, 0, 1, -1, -1, 2}));
}

TEST(MoeExpertsMath, ForwardPipelineMatchesCpuKernel) {
  uint32_t seed = 300;
  for (const Geometry& g : geometries()) {
    const auto x = randomValues<float>(g.tokens * g.hidden, seed++);
    const auto weights = randomValues<float>(g.tokens * g.topK, seed++, 0.1, 1.0);
    const auto gateUp = randomValues<float>(g.experts * 2 * g.inner * g.hidden, seed++, -0.5, 0.5);
    const auto down = randomValues<float>(g.experts * g.hidden * g.inner, seed++, -0.5, 0.5);
    KernelCall call("moe_experts", {{"expert_offset", g.offset}});
    call.input(DType::F32, {g.tokens, g.hidden}, x).input(DType::F32, {g.tokens, g.topK}, weights);
    call.input(DType::I64, {g.tokens, g.topK}, g.indices);
    call.input(DType::F32, {g.experts, 2 * g.inner, g.hidden}, gateUp).input(DType::F32, {g.experts, g.hidden, g.inner}, down);
    call.output(DType::F32, {g.tokens, g.hidden});
    call.run();
    expectNear(emulateForward(g, x, weights, gateUp, down), call.result<float>(0),
               "y (" + std::to_string(g.experts) + " experts)");
  }
}

TEST(MoeExpertsMath, BackwardPipelineMatchesCpuKernel) {
  uint32_t seed = 400;
  for (const Geometry& g : geometries()) {
    const auto x = randomValues<float>(g.tokens * g.hidden, seed++);
    const auto weights = randomValues<float>(g.tokens * g.topK, seed++, 0.1, 1.0);
    const auto gateUp = randomValues<float>(g.experts * 2 * g.inner * g.hidden, seed++, -0.5, 0.5);
    const auto down = randomValues<float>(g.experts * g.hidden * g.inner, seed++, -0.5, 0.5);
    const auto dy = randomValues<float>(g.tokens * g.hidden, seed++);
    KernelCall call("moe_experts_backward", {{"expert_offset", g.offset}});
    call.input(DType::F32, {g.tokens, g.hidden}, x).input(DType::F32, {g.tokens, g.topK}, weights);
    call.input(DType::I64, {g.tokens, g.topK}, g.indices);
    call.input(DType::F32, {g.experts, 2 * g.inner, g.hidden}, gateUp).input(DType::F32, {g.experts, g.hidden, g.inner}, down);
    call.input(DType::F32, {g.tokens, g.hidden}, dy);
    call.output(DType::F32, {g.tokens, g.hidden}).output(DType::F32, {g.tokens, g.topK});
    call.output(DType::F32, {g.experts, 2 * g.inner, g.hidden}).output(DType::F32, {g.experts, g.hidden, g.inner});
    call.run();
    const Gradients emulated = emulateBackward(g, x, weights, gateUp, down, dy);
    const std::string experts = " (" + std::to_string(g.experts) + " experts)";
    expectNear(emulated.dx, call.result<float>(0), "dx" + experts);
    expectNear(emulated.dWeights, call.result<float>(1), "dweights" + experts);
    expectNear(emulated.dGateUp, call.result<float>(2), "dgate_up" + experts);
    expectNear(emulated.dDown, call.result<float>(3), "ddown" + experts);
  }
}

}  // namespace
}  // namespace dgemma::test
