// moe_experts, moe_experts_backward and the expert-parallel moe_local_experts[_backward] on CUDA
// (moe/experts.cu), outside the GEMMs: the grouping of the rows by local expert (on the host: the
// grouped GEMMs need their row counts there), the sizes and operand offsets of each grouped GEMM's
// per-expert problems, and the per-element bodies of the kernels between the GEMMs (row gathers and
// scatters, the gated GELU and its derivative, the weighted combine and the route-ordered sums).
// test/unit/kernels/MoeExpertsMathTest.cpp runs the whole CUDA pipelines on the host with these
// functions and a plain GEMM per problem against the CPU kernels. Plain C++ when not compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "runtime/kernels/HostDevice.h"
#include "support/Error.h"

namespace dgemma::moe_experts {

// Which slot of the expert-sorted row blocks each route (token, j) takes. Only the routes to the
// experts [expertOffset, expertOffset + experts) take one; the slots are handed out in (token, j)
// order within each expert, so the grouping depends on the indices alone (the CPU kernel's order).
struct RouteGroups {
  static constexpr int64_t kNoSlot = -1;
  std::vector<int64_t> firstSlot;    // local expert e's routes take slots [firstSlot[e], firstSlot[e + 1])
  std::vector<int64_t> slotOfRoute;  // per route (token * k + j), or kNoSlot
  std::vector<int64_t> tokenOfSlot;
  std::vector<int64_t> routeOfSlot;
  int64_t slots() const { return firstSlot.back(); }
};

inline RouteGroups groupRoutes(const int64_t* indices, int64_t tokens, int64_t topK, int64_t experts,
                               int64_t expertOffset) {
  const int64_t routes = tokens * topK;
  auto localExpert = [&](int64_t route) {
    const int64_t expert = indices[route] - expertOffset;
    return expert >= 0 && expert < experts ? expert : int64_t{-1};
  };
  RouteGroups groups;
  groups.firstSlot.assign(static_cast<size_t>(experts + 1), 0);
  for (int64_t route = 0; route < routes; ++route)
    if (const int64_t expert = localExpert(route); expert >= 0) ++groups.firstSlot[expert + 1];
  for (int64_t e = 0; e < experts; ++e) groups.firstSlot[e + 1] += groups.firstSlot[e];
  std::vector<int64_t> nextSlot(groups.firstSlot.begin(), groups.firstSlot.end() - 1);
  groups.slotOfRoute.assign(static_cast<size_t>(routes), RouteGroups::kNoSlot);
  groups.tokenOfSlot.resize(static_cast<size_t>(groups.slots()));
  groups.routeOfSlot.resize(static_cast<size_t>(groups.slots()));
  for (int64_t route = 0; route < routes; ++route) {
    const int64_t expert = localExpert(route);
    if (expert < 0) continue;
    const int64_t slot = nextSlot[expert]++;
    groups.slotOfRoute[route] = slot;
    groups.tokenOfSlot[slot] = route / topK;
    groups.routeOfSlot[slot] = route;
  }
  return groups;
}

// moe_local_experts: the received rows [C, H] are grouped by source peer, then by local expert, as
// expert_counts [G, E] says; slot s of expert e's block reads row rowOfSlot[s], the sources in order.
// Negative counts, or more counted rows than the capacity C, are the CPU kernel's run-time errors.
struct LocalBlocks {
  std::vector<int64_t> firstSlot;  // expert e's rows take slots [firstSlot[e], firstSlot[e + 1])
  std::vector<int64_t> rowOfSlot;
  int64_t slots() const { return firstSlot.back(); }
};

inline LocalBlocks localBlocks(const std::string& where, const int64_t* counts, int64_t peers, int64_t experts,
                               int64_t capacity) {
  int64_t total = 0;
  for (int64_t i = 0; i < peers * experts; ++i) {
    if (counts[i] < 0)
      throw RuntimeError(where + ": expert_counts[" + std::to_string(i / experts) + ", " + std::to_string(i % experts) +
                         "] = " + std::to_string(counts[i]) + " is negative");
    total += counts[i];
  }
  if (total > capacity)
    throw RuntimeError(where + ": expert_counts count " + std::to_string(total) + " rows, more than the " +
                       std::to_string(capacity) + " received rows the buffer holds");
  LocalBlocks blocks;
  blocks.firstSlot.assign(static_cast<size_t>(experts + 1), 0);
  blocks.rowOfSlot.reserve(static_cast<size_t>(total));
  for (int64_t expert = 0; expert < experts; ++expert) {
    int64_t row = 0;  // the first row of (source, expert) in the received order
    for (int64_t source = 0; source < peers; ++source) {
      const int64_t* sourceCounts = counts + source * experts;
      for (int64_t e = 0; e < expert; ++e) row += sourceCounts[e];
      for (int64_t i = 0; i < sourceCounts[expert]; ++i) blocks.rowOfSlot.push_back(row + i);
      for (int64_t e = expert; e < experts; ++e) row += sourceCounts[e];
    }
    blocks.firstSlot[expert + 1] = static_cast<int64_t>(blocks.rowOfSlot.size());
  }
  return blocks;
}

// ---- the grouped products ------------------------------------------------------------------------

// Each GEMM of the expert pipeline is one grouped call with a problem per used expert: row-major
// C = op(A) · op(B), C [m, n], inner size k. The expert's row count R is m (a product over its rows)
// or k (a weight gradient, a sum over its rows), so the problems differ in that one size. An operand
// starts at the expert's first slot of a slot-ordered block, or at the expert's matrix of a weight
// tensor.
struct ExpertOperand {
  bool atSlot;     // a slot-ordered block (offset firstSlot · stride); else a weight tensor (expert · stride)
  int64_t stride;  // elements per slot row, or per expert matrix
  int64_t offset(int64_t expert, int64_t firstSlot) const { return (atSlot ? firstSlot : expert) * stride; }
};

struct ExpertProduct {
  bool transposeA, transposeB;
  bool rowsAreInner;  // R is k; else R is m
  int64_t m, n, k;    // the sizes other than R (R's entry is unused)
  ExpertOperand a, b, c;
  int64_t lda, ldb, ldc;
};

// The pipeline's six products for hidden size H and expert hidden size I (W = 2I), in the CPU kernels'
// notation (moe/cpu.cpp): X the rows [R, H], GU = X [G_e; U_e]ᵀ [R, W], Hd [R, I] (the gated GELU,
// forward: in GU's gate half, leading dimension W), dY [R, H], P = dY D_e [R, I], dGU [R, W].
struct ExpertProducts {
  ExpertProduct gateUp, down;                                                     // forward: GU, then Hd D_eᵀ
  ExpertProduct downGradient, outputGradientDown, gateUpGradient, inputGradient;  // dD_e, P, d[G_e; U_e], dX
};

inline ExpertProducts expertProducts(int64_t hidden, int64_t inner) {
  const int64_t h = hidden, i = inner, w = 2 * inner;
  const ExpertOperand rowsOf{true, h}, gateUpRows{true, w}, innerRows{true, i};
  const ExpertOperand gateUpWeights{false, w * h}, downWeights{false, h * i};
  ExpertProducts p;
  p.gateUp = {false, true, false, 0, w, h, rowsOf, gateUpWeights, gateUpRows, h, h, w};
  p.down = {false, true, false, 0, h, i, gateUpRows, downWeights, rowsOf, w, i, h};
  p.downGradient = {true, false, true, h, i, 0, rowsOf, innerRows, downWeights, h, i, i};
  p.outputGradientDown = {false, false, false, 0, i, h, rowsOf, downWeights, innerRows, h, i, i};
  p.gateUpGradient = {true, false, true, w, h, 0, gateUpRows, rowsOf, gateUpWeights, w, h, h};
  p.inputGradient = {false, false, false, 0, h, w, gateUpRows, gateUpWeights, rowsOf, w, h, h};
  return p;
}

// The per-expert LoRA adapters' products (docs/kernels.md, "Expert adapters") for rank r, in the
// CPU kernel's notation: A1 [r, H], B1 [W, r], A2 [r, I], B2 [H, r] per expert, s the scale; the
// rank-r rows T are scaled by s between the products (scaleElement), so W + s·BA is never formed.
struct AdapterProducts {
  ExpertProduct gateUpLow, gateUpAdd;  // T1 = X A1ᵀ; GU += T1 B1ᵀ (accumulating)
  ExpertProduct downLow, downAdd;  // T2 = Hd A2ᵀ (Hd in GU's gate half); out += T2 B2ᵀ
  // The backward: Q = dY B2, dA2 = Qᵀ (w ⊙ Hd), P += Q A2, T2w = (w ⊙ Hd) A2ᵀ, dB2 = dYᵀ T2w,
  // dB1 = dGUᵀ T1, dT1 = dGU B1, dA1 = dT1ᵀ X, dX += dT1 A1.
  ExpertProduct outputGradientLow, downAGradient, hiddenGradientAdd, weightedHiddenLow, downBGradient;
  ExpertProduct gateUpBGradient, gateUpLowGradient, gateUpAGradient, inputGradientAdd;
};

inline AdapterProducts adapterProducts(int64_t hidden, int64_t inner, int64_t rank) {
  const int64_t h = hidden, i = inner, w = 2 * inner, r = rank;
  const ExpertOperand rowsOf{true, h}, gateUpRows{true, w}, innerRows{true, i}, rankRows{true, r};
  const ExpertOperand gateUpA{false, r * h}, gateUpB{false, w * r}, downA{false, r * i}, downB{false, h * r};
  AdapterProducts p;
  p.gateUpLow = {false, true, false, 0, r, h, rowsOf, gateUpA, rankRows, h, h, r};
  p.gateUpAdd = {false, true, false, 0, w, r, rankRows, gateUpB, gateUpRows, r, r, w};
  p.downLow = {false, true, false, 0, r, i, gateUpRows, downA, rankRows, w, i, r};
  p.downAdd = {false, true, false, 0, h, r, rankRows, downB, rowsOf, r, r, h};
  p.outputGradientLow = {false, false, false, 0, r, h, rowsOf, downB, rankRows, h, r, r};
  p.downAGradient = {true, false, true, r, i, 0, rankRows, innerRows, downA, r, i, i};
  p.hiddenGradientAdd = {false, false, false, 0, i, r, rankRows, downA, innerRows, r, i, i};
  p.weightedHiddenLow = {false, true, false, 0, r, i, innerRows, downA, rankRows, i, i, r};
  p.downBGradient = {true, false, true, h, r, 0, rowsOf, rankRows, downB, h, r, r};
  p.gateUpBGradient = {true, false, true, w, r, 0, gateUpRows, rankRows, gateUpB, w, r, r};
  p.gateUpLowGradient = {false, false, false, 0, r, w, gateUpRows, gateUpB, rankRows, w, r, r};
  p.gateUpAGradient = {true, false, true, r, h, 0, rankRows, rowsOf, gateUpA, r, h, h};
  p.inputGradientAdd = {false, false, false, 0, h, r, rankRows, gateUpA, rowsOf, r, h, h};
  return p;
}

// One problem of a grouped call: its sizes and where its operands start (elements).
struct ExpertProblem {
  int64_t m, n, k;
  int64_t aOffset, bOffset, cOffset;
};

// The problems of `product` for the experts with at least one row, in expert order;
// firstSlot[e]..firstSlot[e + 1] are expert e's slots.
inline std::vector<ExpertProblem> expertProblems(const ExpertProduct& product, const std::vector<int64_t>& firstSlot) {
  std::vector<ExpertProblem> problems;
  for (size_t e = 0; e + 1 < firstSlot.size(); ++e) {
    const int64_t expert = static_cast<int64_t>(e), first = firstSlot[e], rows = firstSlot[e + 1] - first;
    if (rows == 0) continue;
    problems.push_back({product.rowsAreInner ? product.m : rows, product.n, product.rowsAreInner ? rows : product.k,
                        product.a.offset(expert, first), product.b.offset(expert, first), product.c.offset(expert, first)});
  }
  return problems;
}

DGEMMA_HOST_DEVICE inline float geluTanh(float x) {
  constexpr float kSqrtTwoOverPi = 0.7978845608028654f, kCubic = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(kSqrtTwoOverPi * (x + kCubic * x * x * x)));
}

DGEMMA_HOST_DEVICE inline float geluTanhDerivative(float x) {
  constexpr float kSqrtTwoOverPi = 0.7978845608028654f, kCubic = 0.044715f;
  const float t = tanhf(kSqrtTwoOverPi * (x + kCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrtTwoOverPi * (1.0f + 3.0f * kCubic * x * x);
}

// Element (slot, h) of a slot-ordered copy of rows: rows[slot, h] = source[rowOfSlot[slot], h].
DGEMMA_HOST_DEVICE inline void gatherElement(const float* source, const int64_t* rowOfSlot, float* rows, int64_t hidden,
                                             int64_t element) {
  const int64_t slot = element / hidden, h = element - slot * hidden;
  rows[element] = source[rowOfSlot[slot] * hidden + h];
}

// Its inverse: destination[rowOfSlot[slot], h] = rows[slot, h] (rowOfSlot is one to one).
DGEMMA_HOST_DEVICE inline void scatterElement(const float* rows, const int64_t* rowOfSlot, float* destination,
                                              int64_t hidden, int64_t element) {
  const int64_t slot = element / hidden, h = element - slot * hidden;
  destination[rowOfSlot[slot] * hidden + h] = rows[element];
}

// Element (slot, c < I) of a [gate | up] row of width 2I: the gate half becomes gelu(gate) ⊙ up.
DGEMMA_HOST_DEVICE inline void gatedGeluElement(float* gateUp, int64_t inner, int64_t element) {
  const int64_t slot = element / inner, c = element - slot * inner;
  float* row = gateUp + slot * 2 * inner;
  row[c] = geluTanh(row[c]) * row[inner + c];
}

// The backward's recomputed hidden state of element (slot, c): hidden = gelu(gate) ⊙ up and the
// weighted hidden = w · hidden, w = weights[weightOfSlot[slot]] the slot's weight.
DGEMMA_HOST_DEVICE inline void gatedGeluWeightedElement(const float* gateUp, const float* weights,
                                                        const int64_t* weightOfSlot, float* hidden, float* weighted,
                                                        int64_t inner, int64_t element) {
  const int64_t slot = element / inner, c = element - slot * inner;
  const float* row = gateUp + slot * 2 * inner;
  const float state = geluTanh(row[c]) * row[inner + c];
  hidden[element] = state;
  weighted[element] = weights[weightOfSlot[slot]] * state;
}

// With dState = w · dHidden: dGate = dState · up · gelu'(gate), dUp = dState · gelu(gate), into the
// slot's [dGate | dUp] row.
DGEMMA_HOST_DEVICE inline void gatedGeluBackwardElement(const float* gateUp, const float* dHidden, const float* weights,
                                                        const int64_t* weightOfSlot, float* dGateUp, int64_t inner,
                                                        int64_t element) {
  const int64_t slot = element / inner, c = element - slot * inner;
  const float* row = gateUp + slot * 2 * inner;
  float* dRow = dGateUp + slot * 2 * inner;
  const float gate = row[c];
  const float dState = weights[weightOfSlot[slot]] * dHidden[element];
  dRow[c] = dState * row[inner + c] * geluTanhDerivative(gate);
  dRow[inner + c] = dState * geluTanh(gate);
}

// Element (token, h) of y = Σ_j w[token, j] · out[slot of (token, j)], over j in order from zero;
// routes without a slot add nothing.
DGEMMA_HOST_DEVICE inline void combineElement(const float* expertOutput, const float* weights, const int64_t* slotOfRoute,
                                              float* y, int64_t topK, int64_t hidden, int64_t element) {
  const int64_t token = element / hidden, h = element - token * hidden;
  float sum = 0.0f;
  for (int64_t j = 0; j < topK; ++j) {
    const int64_t route = token * topK + j, slot = slotOfRoute[route];
    if (slot >= 0) sum += weights[route] * expertOutput[slot * hidden + h];
  }
  y[element] = sum;
}

// Element (token, h) of dx = Σ_j dInput[slot of (token, j)], over j in order from zero.
DGEMMA_HOST_DEVICE inline void inputGradientElement(const float* dInput, const int64_t* slotOfRoute, float* dx,
                                                    int64_t topK, int64_t hidden, int64_t element) {
  const int64_t token = element / hidden, h = element - token * hidden;
  float sum = 0.0f;
  for (int64_t j = 0; j < topK; ++j) {
    const int64_t slot = slotOfRoute[token * topK + j];
    if (slot >= 0) sum += dInput[slot * hidden + h];
  }
  dx[element] = sum;
}

// dw of a slot: Σ_c hidden[slot, c] · (dy D)[slot, c], in order.
DGEMMA_HOST_DEVICE inline void slotWeightGradient(const float* hidden, const float* dOutputDown, float* dWeights,
                                                  int64_t inner, int64_t slot) {
  float sum = 0.0f;
  for (int64_t c = 0; c < inner; ++c) sum += hidden[slot * inner + c] * dOutputDown[slot * inner + c];
  dWeights[slot] = sum;
}

// An adapter's rank-r row element times the scale s (in f32, as the CPU kernel's f32 twin).
DGEMMA_HOST_DEVICE inline void scaleElement(float* values, float scale, int64_t element) { values[element] *= scale; }

// A route's value from its slot's, 0 for a route without a slot (moe_experts' dw).
DGEMMA_HOST_DEVICE inline void routeValueElement(const float* slotValues, const int64_t* slotOfRoute, float* routeValues,
                                                 int64_t route) {
  const int64_t slot = slotOfRoute[route];
  routeValues[route] = slot >= 0 ? slotValues[slot] : 0.0f;
}

}  // namespace dgemma::moe_experts
