// runtime/kernels/moe/ExpertsMath.h: the CUDA moe_experts, moe_experts_backward and
// moe_local_experts[_backward] (moe/experts.cu) run on the host step by step (the grouping, each
// element kernel's body over all its elements, and each grouped GEMM as a plain GEMM per problem with
// the sizes and offsets of expertProblems) against the CPU kernels, with and without the kept gate/up
// rows (gate_up_rows), with repeated experts, a block of the experts (expert_offset; routes to other blocks),
// an unused expert, received rows from several sources with uncounted capacity, and the per-expert
// adapters over a frozen base (adapterProducts). Tolerance 2e-5 of
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

// One grouped GEMM of moe/experts.cu: a plain GEMM per problem, with the sizes and offsets the CUDA
// kernel hands cuBLAS.
void groupedGemm(const moe_experts::ExpertProduct& product, const std::vector<int64_t>& firstSlot, const float* a,
                 const float* b, float* c) {
  for (const moe_experts::ExpertProblem& problem : moe_experts::expertProblems(product, firstSlot))
    hostGemm(product.transposeA, product.transposeB, problem.m, problem.n, problem.k, a + problem.aOffset, product.lda,
             b + problem.bOffset, product.ldb, c + problem.cOffset, product.ldc);
}

// moe_experts' gate_up_rows [N·k, 2I] and the map from each slot to its route (row).
struct KeptRows {
  std::vector<float>* rows;
  const std::vector<int64_t>* routeOfSlot;
};

// The expert pipeline of moe/experts.cu (expertsForward) over slot-ordered blocks; with `kept`, each
// slot's gate/up row scattered to its route's row before the GELU.
std::vector<float> pipelineForward(const std::vector<int64_t>& firstSlot, const std::vector<int64_t>& rowOfSlot,
                                   int64_t hidden, int64_t inner, const std::vector<float>& rows,
                                   const std::vector<float>& gateUp, const std::vector<float>& down,
                                   const KeptRows& kept = {nullptr, nullptr}) {
  const int64_t slots = firstSlot.back(), width = 2 * inner;
  std::vector<float> input(slots * hidden), gateUpOutput(slots * width), output(slots * hidden);
  for (int64_t e = 0; e < slots * hidden; ++e) moe_experts::gatherElement(rows.data(), rowOfSlot.data(), input.data(), hidden, e);
  const moe_experts::ExpertProducts products = moe_experts::expertProducts(hidden, inner);
  groupedGemm(products.gateUp, firstSlot, input.data(), gateUp.data(), gateUpOutput.data());
  if (kept.rows != nullptr)
    for (int64_t e = 0; e < slots * width; ++e)
      moe_experts::scatterElement(gateUpOutput.data(), kept.routeOfSlot->data(), kept.rows->data(), width, e);
  for (int64_t e = 0; e < slots * inner; ++e) moe_experts::gatedGeluElement(gateUpOutput.data(), inner, e);
  groupedGemm(products.down, firstSlot, gateUpOutput.data(), down.data(), output.data());
  return output;
}

struct PipelineGradients {
  std::vector<float> dInput, slotDWeights, dGateUp, dDown;
};

// expertsBackward of moe/experts.cu; weights[weightOfSlot[slot]] is a slot's weight. With
// `keptRows`, the slots' gate/up rows are gathered from it by route (weightOfSlot) instead of the
// gate/up product.
PipelineGradients pipelineBackward(const std::vector<int64_t>& firstSlot, const std::vector<int64_t>& rowOfSlot,
                                   const std::vector<int64_t>& weightOfSlot, int64_t hidden,
                                   int64_t inner, const std::vector<float>& rows, const std::vector<float>& dRows,
                                   const std::vector<float>& weights, const std::vector<float>& gateUp,
                                   const std::vector<float>& down, const std::vector<float>* keptRows = nullptr) {
  const int64_t slots = firstSlot.back(), width = 2 * inner, experts = static_cast<int64_t>(firstSlot.size()) - 1;
  PipelineGradients out{std::vector<float>(slots * hidden), std::vector<float>(slots),
                        std::vector<float>(experts * width * hidden), std::vector<float>(experts * hidden * inner)};
  std::vector<float> input(slots * hidden), dOutput(slots * hidden), gateUpOutput(slots * width),
      dGateUpOutput(slots * width), hiddenState(slots * inner), weightedHidden(slots * inner), dOutputDown(slots * inner);
  for (int64_t e = 0; e < slots * hidden; ++e) {
    moe_experts::gatherElement(rows.data(), rowOfSlot.data(), input.data(), hidden, e);
    moe_experts::gatherElement(dRows.data(), rowOfSlot.data(), dOutput.data(), hidden, e);
  }
  const moe_experts::ExpertProducts products = moe_experts::expertProducts(hidden, inner);
  if (keptRows != nullptr)
    for (int64_t e = 0; e < slots * width; ++e)
      moe_experts::gatherElement(keptRows->data(), weightOfSlot.data(), gateUpOutput.data(), width, e);
  else
    groupedGemm(products.gateUp, firstSlot, input.data(), gateUp.data(), gateUpOutput.data());
  for (int64_t e = 0; e < slots * inner; ++e)
    moe_experts::gatedGeluWeightedElement(gateUpOutput.data(), weights.data(), weightOfSlot.data(), hiddenState.data(),
                                          weightedHidden.data(), inner, e);
  groupedGemm(products.downGradient, firstSlot, dOutput.data(), weightedHidden.data(), out.dDown.data());
  groupedGemm(products.outputGradientDown, firstSlot, dOutput.data(), down.data(), dOutputDown.data());
  for (int64_t slot = 0; slot < slots; ++slot)
    moe_experts::slotWeightGradient(hiddenState.data(), dOutputDown.data(), out.slotDWeights.data(), inner, slot);
  for (int64_t e = 0; e < slots * inner; ++e)
    moe_experts::gatedGeluBackwardElement(gateUpOutput.data(), dOutputDown.data(), weights.data(), weightOfSlot.data(),
                                          dGateUpOutput.data(), inner, e);
  groupedGemm(products.gateUpGradient, firstSlot, dGateUpOutput.data(), input.data(), out.dGateUp.data());
  groupedGemm(products.inputGradient, firstSlot, dGateUpOutput.data(), gateUp.data(), out.dInput.data());
  return out;
}

// With `gateUpRows`, moe_experts' second output: zeros, then the local routes' rows.
std::vector<float> emulateForward(const Geometry& g, const std::vector<float>& x, const std::vector<float>& weights,
                                  const std::vector<float>& gateUp, const std::vector<float>& down,
                                  std::vector<float>* gateUpRows = nullptr) {
  const RouteGroups groups = moe_experts::groupRoutes(g.indices.data(), g.tokens, g.topK, g.experts, g.offset);
  if (gateUpRows != nullptr) gateUpRows->assign(g.tokens * g.topK * 2 * g.inner, 0.0f);
  const std::vector<float> expertOutput = pipelineForward(groups.firstSlot, groups.tokenOfSlot, g.hidden, g.inner, x,
                                                          gateUp, down, {gateUpRows, &groups.routeOfSlot});
  std::vector<float> y(g.tokens * g.hidden);
  for (int64_t e = 0; e < g.tokens * g.hidden; ++e)
    moe_experts::combineElement(expertOutput.data(), weights.data(), groups.slotOfRoute.data(), y.data(), g.topK,
                                g.hidden, e);
  return y;
}

struct Gradients {
  std::vector<float> dx, dWeights, dGateUp, dDown;
};

// With `gateUpRows`, moe_experts_backward's input 6.
Gradients emulateBackward(const Geometry& g, const std::vector<float>& x, const std::vector<float>& weights,
                          const std::vector<float>& gateUp, const std::vector<float>& down, const std::vector<float>& dy,
                          const std::vector<float>* gateUpRows = nullptr) {
  const RouteGroups groups = moe_experts::groupRoutes(g.indices.data(), g.tokens, g.topK, g.experts, g.offset);
  const PipelineGradients p = pipelineBackward(groups.firstSlot, groups.tokenOfSlot, groups.routeOfSlot,
                                               g.hidden, g.inner, x, dy, weights, gateUp, down, gateUpRows);
  Gradients out{std::vector<float>(g.tokens * g.hidden), std::vector<float>(g.tokens * g.topK), p.dGateUp, p.dDown};
  for (int64_t route = 0; route < g.tokens * g.topK; ++route)
    moe_experts::routeValueElement(p.slotDWeights.data(), groups.slotOfRoute.data(), out.dWeights.data(), route);
  for (int64_t e = 0; e < g.tokens * g.hidden; ++e)
    moe_experts::inputGradientElement(p.dInput.data(), groups.slotOfRoute.data(), out.dx.data(), g.topK, g.hidden, e);
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

// One geometry's random operands, drawn from `seed` on.
struct ExpertOperands {
  std::vector<float> x, weights, gateUp, down, dy;
};

ExpertOperands drawOperands(const Geometry& g, uint32_t seed) {
  ExpertOperands o;
  o.x = randomValues<float>(g.tokens * g.hidden, seed);
  o.weights = randomValues<float>(g.tokens * g.topK, seed + 1, 0.1, 1.0);
  o.gateUp = randomValues<float>(g.experts * 2 * g.inner * g.hidden, seed + 2, -0.5, 0.5);
  o.down = randomValues<float>(g.experts * g.hidden * g.inner, seed + 3, -0.5, 0.5);
  o.dy = randomValues<float>(g.tokens * g.hidden, seed + 4);
  return o;
}

// The CPU kernel's call: moe_experts (y, and gate_up_rows when `keepRows`), or moe_experts_backward
// (reading `rows` when given).
KernelCall forwardCall(const Geometry& g, const ExpertOperands& o, bool keepRows) {
  KernelCall call("moe_experts", {{"expert_offset", g.offset}});
  call.input(DType::F32, {g.tokens, g.hidden}, o.x).input(DType::F32, {g.tokens, g.topK}, o.weights);
  call.input(DType::I64, {g.tokens, g.topK}, g.indices);
  call.input(DType::F32, {g.experts, 2 * g.inner, g.hidden}, o.gateUp).input(DType::F32, {g.experts, g.hidden, g.inner}, o.down);
  call.output(DType::F32, {g.tokens, g.hidden});
  if (keepRows) call.output(DType::F32, {g.tokens * g.topK, 2 * g.inner});
  return call;
}

KernelCall backwardCall(const Geometry& g, const ExpertOperands& o, const std::vector<float>* rows) {
  KernelCall call("moe_experts_backward", {{"expert_offset", g.offset}});
  call.input(DType::F32, {g.tokens, g.hidden}, o.x).input(DType::F32, {g.tokens, g.topK}, o.weights);
  call.input(DType::I64, {g.tokens, g.topK}, g.indices);
  call.input(DType::F32, {g.experts, 2 * g.inner, g.hidden}, o.gateUp).input(DType::F32, {g.experts, g.hidden, g.inner}, o.down);
  call.input(DType::F32, {g.tokens, g.hidden}, o.dy);
  if (rows) call.input(DType::F32, {g.tokens * g.topK, 2 * g.inner}, *rows);
  call.output(DType::F32, {g.tokens, g.hidden}).output(DType::F32, {g.tokens, g.topK});
  call.output(DType::F32, {g.experts, 2 * g.inner, g.hidden}).output(DType::F32, {g.experts, g.hidden, g.inner});
  return call;
}

void expectGradients(const Gradients& expected, KernelCall& call, const std::string& what) {
  expectNear(expected.dx, call.result<float>(0), "dx" + what);
  expectNear(expected.dWeights, call.result<float>(1), "dweights" + what);
  expectNear(expected.dGateUp, call.result<float>(2), "dgate_up" + what);
  expectNear(expected.dDown, call.result<float>(3), "ddown" + what);
}

std::string expertsOf(const Geometry& g) { return " (" + std::to_string(g.experts) + " experts)"; }

TEST(MoeExpertsMath, ForwardPipelineMatchesCpuKernel) {
  uint32_t seed = 300;
  for (const Geometry& g : geometries()) {
    const ExpertOperands o = drawOperands(g, seed += 5);
    KernelCall call = forwardCall(g, o, false);
    call.run();
    expectNear(emulateForward(g, o.x, o.weights, o.gateUp, o.down), call.result<float>(0), "y" + expertsOf(g));
  }
}

TEST(MoeExpertsMath, BackwardPipelineMatchesCpuKernel) {
  uint32_t seed = 400;
  for (const Geometry& g : geometries()) {
    const ExpertOperands o = drawOperands(g, seed += 5);
    KernelCall call = backwardCall(g, o, nullptr);
    call.run();
    expectGradients(emulateBackward(g, o.x, o.weights, o.gateUp, o.down, o.dy), call, expertsOf(g));
  }
}

// The forward keeping gate_up_rows (scattered by route over zeros) against the CPU kernel's, and the
// backward gathering them: the emulation's own bytes when recomputing (the same plain GEMMs), and the
// CPU kernel reading the CPU forward's rows.
TEST(MoeExpertsMath, KeptGateUpRowsPipelineMatchesCpuKernels) {
  uint32_t seed = 450;
  for (const Geometry& g : geometries()) {
    const ExpertOperands o = drawOperands(g, seed += 5);
    const std::string experts = expertsOf(g);
    KernelCall forward = forwardCall(g, o, true);
    forward.run();
    std::vector<float> emulatedRows;
    expectNear(emulateForward(g, o.x, o.weights, o.gateUp, o.down, &emulatedRows), forward.result<float>(0),
               "y" + experts);
    const std::vector<float> cpuRows = forward.result<float>(1);
    expectNear(emulatedRows, cpuRows, "gate_up_rows" + experts);

    const Gradients reading = emulateBackward(g, o.x, o.weights, o.gateUp, o.down, o.dy, &emulatedRows);
    const Gradients recomputing = emulateBackward(g, o.x, o.weights, o.gateUp, o.down, o.dy);
    EXPECT_EQ(reading.dx, recomputing.dx) << experts;
    EXPECT_EQ(reading.dWeights, recomputing.dWeights) << experts;
    EXPECT_EQ(reading.dGateUp, recomputing.dGateUp) << experts;
    EXPECT_EQ(reading.dDown, recomputing.dDown) << experts;
    KernelCall backward = backwardCall(g, o, &cpuRows);
    backward.run();
    expectGradients(reading, backward, " reading gate_up_rows" + experts);
  }
}

// moe_local_experts[_backward]: 3 sources, 2 local experts, capacity 14 of which 11 rows are counted
// (expert 1 gets nothing from source 2), against the CPU kernels; the uncounted rows stay zero.
TEST(MoeExpertsMath, LocalExpertsPipelineMatchesCpuKernels) {
  const int64_t peers = 3, experts = 2, capacity = 14, hidden = 10, inner = 6;
  const std::vector<int64_t> counts = {2, 3, 1, 1, 4, 0};
  const moe_experts::LocalBlocks blocks = moe_experts::localBlocks("test", counts.data(), peers, experts, capacity);
  // Source 0's rows 0-4 (expert 0: 0-1, expert 1: 2-4), source 1's 5-6, source 2's 7-10.
  EXPECT_EQ(blocks.firstSlot, (std::vector<int64_t>{0, 7, 11}));
  EXPECT_EQ(blocks.rowOfSlot, (std::vector<int64_t>{0, 1, 5, 7, 8, 9, 10, 2, 3, 4, 6}));
  const auto rows = randomValues<float>(capacity * hidden, 500);
  const auto weights = randomValues<float>(capacity, 501, 0.1, 1.0);
  const auto dRows = randomValues<float>(capacity * hidden, 502);
  const auto gateUp = randomValues<float>(experts * 2 * inner * hidden, 503, -0.5, 0.5);
  const auto down = randomValues<float>(experts * hidden * inner, 504, -0.5, 0.5);

  KernelCall forward("moe_local_experts");
  forward.input(DType::F32, {capacity, hidden}, rows).input(DType::I64, {peers, experts}, counts);
  forward.input(DType::F32, {experts, 2 * inner, hidden}, gateUp).input(DType::F32, {experts, hidden, inner}, down);
  forward.output(DType::F32, {capacity, hidden});
  forward.run();
  const std::vector<float> expertOutput =
      pipelineForward(blocks.firstSlot, blocks.rowOfSlot, hidden, inner, rows, gateUp, down);
  std::vector<float> result(capacity * hidden, 0.0f);
  for (int64_t e = 0; e < blocks.slots() * hidden; ++e)
    moe_experts::scatterElement(expertOutput.data(), blocks.rowOfSlot.data(), result.data(), hidden, e);
  expectNear(result, forward.result<float>(0), "moe_local_experts");

  KernelCall backward("moe_local_experts_backward");
  backward.input(DType::F32, {capacity, hidden}, rows).input(DType::F32, {capacity}, weights);
  backward.input(DType::F32, {capacity, hidden}, dRows).input(DType::I64, {peers, experts}, counts);
  backward.input(DType::F32, {experts, 2 * inner, hidden}, gateUp).input(DType::F32, {experts, hidden, inner}, down);
  backward.output(DType::F32, {capacity, hidden}).output(DType::F32, {capacity});
  backward.output(DType::F32, {experts, 2 * inner, hidden}).output(DType::F32, {experts, hidden, inner});
  backward.run();
  const PipelineGradients p = pipelineBackward(blocks.firstSlot, blocks.rowOfSlot, blocks.rowOfSlot, hidden,
                                               inner, rows, dRows, weights, gateUp, down);
  std::vector<float> gradRows(capacity * hidden, 0.0f), gradWeights(capacity, 0.0f);
  for (int64_t e = 0; e < blocks.slots() * hidden; ++e)
    moe_experts::scatterElement(p.dInput.data(), blocks.rowOfSlot.data(), gradRows.data(), hidden, e);
  for (int64_t slot = 0; slot < blocks.slots(); ++slot)
    moe_experts::scatterElement(p.slotDWeights.data(), blocks.rowOfSlot.data(), gradWeights.data(), 1, slot);
  expectNear(gradRows, backward.result<float>(0), "grad_rows");
  expectNear(gradWeights, backward.result<float>(1), "grad_weights");
  expectNear(p.dGateUp, backward.result<float>(2), "grad_gate_up");
  expectNear(p.dDown, backward.result<float>(3), "grad_down");
}

// ---- the per-expert adapters (adapterProducts): moe/experts.cu's sequence with adapters -----------

// One grouped GEMM added to C (cuBLAS with beta 1): each problem's product into a scratch, then added.
void groupedGemmAdd(const moe_experts::ExpertProduct& product, const std::vector<int64_t>& firstSlot, const float* a,
                    const float* b, float* c) {
  for (const moe_experts::ExpertProblem& problem : moe_experts::expertProblems(product, firstSlot)) {
    std::vector<float> term(problem.m * product.ldc);
    hostGemm(product.transposeA, product.transposeB, problem.m, problem.n, problem.k, a + problem.aOffset, product.lda,
             b + problem.bOffset, product.ldb, term.data(), product.ldc);
    for (int64_t i = 0; i < problem.m; ++i)
      for (int64_t j = 0; j < problem.n; ++j) c[problem.cOffset + i * product.ldc + j] += term[i * product.ldc + j];
  }
}

struct AdapterOperands {
  int64_t rank = 2;
  float scale = 1.25f;
  std::vector<float> gateUpA, gateUpB, downA, downB;
};

AdapterOperands drawAdapters(const Geometry& g, uint32_t seed) {
  AdapterOperands a;
  const int64_t r = a.rank;
  a.gateUpA = randomValues<float>(g.experts * r * g.hidden, seed, -0.5, 0.5);
  a.gateUpB = randomValues<float>(g.experts * 2 * g.inner * r, seed + 1, -0.5, 0.5);
  a.downA = randomValues<float>(g.experts * r * g.inner, seed + 2, -0.5, 0.5);
  a.downB = randomValues<float>(g.experts * g.hidden * r, seed + 3, -0.5, 0.5);
  return a;
}

void scaleRows(std::vector<float>& rows, float scale) {
  for (int64_t e = 0; e < static_cast<int64_t>(rows.size()); ++e) moe_experts::scaleElement(rows.data(), scale, e);
}

// expertsForward with both pairs, then the combine.
std::vector<float> emulateAdapterForward(const Geometry& g, const ExpertOperands& o, const AdapterOperands& a) {
  const RouteGroups groups = moe_experts::groupRoutes(g.indices.data(), g.tokens, g.topK, g.experts, g.offset);
  const std::vector<int64_t>& first = groups.firstSlot;
  const int64_t slots = groups.slots(), h = g.hidden, i = g.inner, w = 2 * g.inner, r = a.rank;
  std::vector<float> input(slots * h), gateUpOutput(slots * w), output(slots * h), low(slots * r);
  for (int64_t e = 0; e < slots * h; ++e)
    moe_experts::gatherElement(o.x.data(), groups.tokenOfSlot.data(), input.data(), h, e);
  const moe_experts::ExpertProducts products = moe_experts::expertProducts(h, i);
  const moe_experts::AdapterProducts adapter = moe_experts::adapterProducts(h, i, r);
  groupedGemm(products.gateUp, first, input.data(), o.gateUp.data(), gateUpOutput.data());
  groupedGemm(adapter.gateUpLow, first, input.data(), a.gateUpA.data(), low.data());
  scaleRows(low, a.scale);
  groupedGemmAdd(adapter.gateUpAdd, first, low.data(), a.gateUpB.data(), gateUpOutput.data());
  for (int64_t e = 0; e < slots * i; ++e) moe_experts::gatedGeluElement(gateUpOutput.data(), i, e);
  groupedGemm(products.down, first, gateUpOutput.data(), o.down.data(), output.data());
  groupedGemm(adapter.downLow, first, gateUpOutput.data(), a.downA.data(), low.data());
  scaleRows(low, a.scale);
  groupedGemmAdd(adapter.downAdd, first, low.data(), a.downB.data(), output.data());
  std::vector<float> y(g.tokens * h);
  for (int64_t e = 0; e < g.tokens * h; ++e)
    moe_experts::combineElement(output.data(), o.weights.data(), groups.slotOfRoute.data(), y.data(), g.topK, h, e);
  return y;
}

// expertsBackward with both pairs and a frozen base (no dgate_up, no ddown): dx, dweights, dA1, dB1,
// dA2, dB2.
std::vector<std::vector<float>> emulateAdapterBackward(const Geometry& g, const ExpertOperands& o,
                                                       const AdapterOperands& a) {
  const RouteGroups groups = moe_experts::groupRoutes(g.indices.data(), g.tokens, g.topK, g.experts, g.offset);
  const std::vector<int64_t>& first = groups.firstSlot;
  const int64_t slots = groups.slots(), h = g.hidden, i = g.inner, w = 2 * g.inner, r = a.rank, e_ = g.experts;
  std::vector<float> input(slots * h), dOutput(slots * h), dInput(slots * h), gateUpOutput(slots * w),
      dGateUpOutput(slots * w), hiddenState(slots * i), weightedHidden(slots * i), dOutputDown(slots * i),
      slotDWeights(slots), lowInput(slots * r), lowGradient(slots * r);
  std::vector<float> dA1(e_ * r * h), dB1(e_ * w * r), dA2(e_ * r * i), dB2(e_ * h * r);
  for (int64_t e = 0; e < slots * h; ++e) {
    moe_experts::gatherElement(o.x.data(), groups.tokenOfSlot.data(), input.data(), h, e);
    moe_experts::gatherElement(o.dy.data(), groups.tokenOfSlot.data(), dOutput.data(), h, e);
  }
  const moe_experts::ExpertProducts products = moe_experts::expertProducts(h, i);
  const moe_experts::AdapterProducts adapter = moe_experts::adapterProducts(h, i, r);
  groupedGemm(products.gateUp, first, input.data(), o.gateUp.data(), gateUpOutput.data());
  groupedGemm(adapter.gateUpLow, first, input.data(), a.gateUpA.data(), lowInput.data());
  scaleRows(lowInput, a.scale);
  groupedGemmAdd(adapter.gateUpAdd, first, lowInput.data(), a.gateUpB.data(), gateUpOutput.data());
  for (int64_t e = 0; e < slots * i; ++e)
    moe_experts::gatedGeluWeightedElement(gateUpOutput.data(), o.weights.data(), groups.routeOfSlot.data(),
                                          hiddenState.data(), weightedHidden.data(), i, e);
  groupedGemm(products.outputGradientDown, first, dOutput.data(), o.down.data(), dOutputDown.data());
  groupedGemm(adapter.outputGradientLow, first, dOutput.data(), a.downB.data(), lowGradient.data());
  scaleRows(lowGradient, a.scale);
  groupedGemm(adapter.downAGradient, first, lowGradient.data(), weightedHidden.data(), dA2.data());
  groupedGemmAdd(adapter.hiddenGradientAdd, first, lowGradient.data(), a.downA.data(), dOutputDown.data());
  groupedGemm(adapter.weightedHiddenLow, first, weightedHidden.data(), a.downA.data(), lowGradient.data());
  scaleRows(lowGradient, a.scale);
  groupedGemm(adapter.downBGradient, first, dOutput.data(), lowGradient.data(), dB2.data());
  for (int64_t slot = 0; slot < slots; ++slot)
    moe_experts::slotWeightGradient(hiddenState.data(), dOutputDown.data(), slotDWeights.data(), i, slot);
  for (int64_t e = 0; e < slots * i; ++e)
    moe_experts::gatedGeluBackwardElement(gateUpOutput.data(), dOutputDown.data(), o.weights.data(),
                                          groups.routeOfSlot.data(), dGateUpOutput.data(), i, e);
  groupedGemm(products.inputGradient, first, dGateUpOutput.data(), o.gateUp.data(), dInput.data());
  groupedGemm(adapter.gateUpBGradient, first, dGateUpOutput.data(), lowInput.data(), dB1.data());
  groupedGemm(adapter.gateUpLowGradient, first, dGateUpOutput.data(), a.gateUpB.data(), lowGradient.data());
  scaleRows(lowGradient, a.scale);
  groupedGemm(adapter.gateUpAGradient, first, lowGradient.data(), input.data(), dA1.data());
  groupedGemmAdd(adapter.inputGradientAdd, first, lowGradient.data(), a.gateUpA.data(), dInput.data());
  std::vector<float> dx(g.tokens * h), dWeights(g.tokens * g.topK);
  for (int64_t route = 0; route < g.tokens * g.topK; ++route)
    moe_experts::routeValueElement(slotDWeights.data(), groups.slotOfRoute.data(), dWeights.data(), route);
  for (int64_t e = 0; e < g.tokens * h; ++e)
    moe_experts::inputGradientElement(dInput.data(), groups.slotOfRoute.data(), dx.data(), g.topK, h, e);
  return {dx, dWeights, dA1, dB1, dA2, dB2};
}

void addAdapterInputs(KernelCall& call, const Geometry& g, const AdapterOperands& a) {
  const int64_t r = a.rank;
  call.input(DType::F32, {g.experts, r, g.hidden}, a.gateUpA).input(DType::F32, {g.experts, 2 * g.inner, r}, a.gateUpB);
  call.input(DType::F32, {g.experts, r, g.inner}, a.downA).input(DType::F32, {g.experts, g.hidden, r}, a.downB);
}

TEST(MoeExpertsMath, AdapterPipelineMatchesCpuKernels) {
  uint32_t seed = 600;
  for (const Geometry& g : geometries()) {
    const ExpertOperands o = drawOperands(g, seed += 10);
    const AdapterOperands a = drawAdapters(g, seed + 5);
    const std::string experts = expertsOf(g);
    const nlohmann::json attrs = {
        {"expert_offset", g.offset}, {"lora_gate_up", true}, {"lora_down", true}, {"lora_scale", a.scale}};
    KernelCall forward("moe_experts", attrs);
    forward.input(DType::F32, {g.tokens, g.hidden}, o.x).input(DType::F32, {g.tokens, g.topK}, o.weights);
    forward.input(DType::I64, {g.tokens, g.topK}, g.indices);
    forward.input(DType::F32, {g.experts, 2 * g.inner, g.hidden}, o.gateUp);
    forward.input(DType::F32, {g.experts, g.hidden, g.inner}, o.down);
    addAdapterInputs(forward, g, a);
    forward.output(DType::F32, {g.tokens, g.hidden});
    forward.run();
    expectNear(emulateAdapterForward(g, o, a), forward.result<float>(0), "y with adapters" + experts);

    nlohmann::json backwardAttrs = attrs;
    backwardAttrs.update({{"grad_gate_up", false}, {"grad_down", false}});
    KernelCall backward("moe_experts_backward", backwardAttrs);
    backward.input(DType::F32, {g.tokens, g.hidden}, o.x).input(DType::F32, {g.tokens, g.topK}, o.weights);
    backward.input(DType::I64, {g.tokens, g.topK}, g.indices);
    backward.input(DType::F32, {g.experts, 2 * g.inner, g.hidden}, o.gateUp);
    backward.input(DType::F32, {g.experts, g.hidden, g.inner}, o.down);
    backward.input(DType::F32, {g.tokens, g.hidden}, o.dy);
    addAdapterInputs(backward, g, a);
    const int64_t r = a.rank;
    backward.output(DType::F32, {g.tokens, g.hidden}).output(DType::F32, {g.tokens, g.topK});
    backward.output(DType::F32, {g.experts, r, g.hidden}).output(DType::F32, {g.experts, 2 * g.inner, r});
    backward.output(DType::F32, {g.experts, r, g.inner}).output(DType::F32, {g.experts, g.hidden, r});
    backward.run();
    const std::vector<std::vector<float>> emulated = emulateAdapterBackward(g, o, a);
    const char* names[] = {"dx", "dweights", "dA1", "dB1", "dA2", "dB2"};
    for (size_t k = 0; k < emulated.size(); ++k)
      expectNear(emulated[k], backward.result<float>(k), names[k] + (" with adapters" + experts));
  }
}

TEST(MoeExpertsMath, LocalBlocksRejectBadCountsAsTheCpuKernelDoes) {
  const std::vector<int64_t> negative = {1, -2}, tooMany = {3, 4};
  EXPECT_THROW(moe_experts::localBlocks("step", negative.data(), 1, 2, 8), RuntimeError);
  try {
    moe_experts::localBlocks("step", tooMany.data(), 1, 2, 6);
    FAIL() << "7 counted rows in a capacity of 6 accepted";
  } catch (const RuntimeError& error) {
    EXPECT_NE(std::string(error.what()).find("count 7 rows, more than the 6 received rows"), std::string::npos)
        << error.what();
  }
}

}  // namespace
}  // namespace dgemma::test
