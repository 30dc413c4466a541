// moe_experts and moe_experts_backward on CUDA (moe/experts.cu), outside the GEMMs: the grouping of
// the routes by local expert (on the host: the per-expert GEMMs need their row counts there) and the
// per-element bodies of the kernels between the GEMMs (row gathers, the gated GELU and its
// derivative, the weighted combine and the route-ordered sums). test/unit/kernels/
// MoeExpertsMathTest.cpp runs the whole CUDA pipeline on the host with these functions and plain
// GEMMs against the CPU kernels. Plain C++ when not compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/kernels/HostDevice.h"

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

DGEMMA_HOST_DEVICE inline float geluTanh(float x) {
  constexpr float kSqrtTwoOverPi = 0.7978845608028654f, kCubic = 0.044715f;
  return 0.5f * x * (1.0f + tanhf(kSqrtTwoOverPi * (x + kCubic * x * x * x)));
}

DGEMMA_HOST_DEVICE inline float geluTanhDerivative(float x) {
  constexpr float kSqrtTwoOverPi = 0.7978845608028654f, kCubic = 0.044715f;
  const float t = tanhf(kSqrtTwoOverPi * (x + kCubic * x * x * x));
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * kSqrtTwoOverPi * (1.0f + 3.0f * kCubic * x * x);
}

// Element (slot, h) of a slot-ordered copy of token rows: rows[slot, h] = source[tokenOfSlot[slot], h].
DGEMMA_HOST_DEVICE inline void gatherElement(const float* source, const int64_t* tokenOfSlot, float* rows, int64_t hidden,
                                             int64_t element) {
  const int64_t slot = element / hidden, h = element - slot * hidden;
  rows[element] = source[tokenOfSlot[slot] * hidden + h];
}

// Element (slot, c < I) of a [gate | up] row of width 2I: the gate half becomes gelu(gate) ⊙ up.
DGEMMA_HOST_DEVICE inline void gatedGeluElement(float* gateUp, int64_t inner, int64_t element) {
  const int64_t slot = element / inner, c = element - slot * inner;
  float* row = gateUp + slot * 2 * inner;
  row[c] = geluTanh(row[c]) * row[inner + c];
}

// The backward's recomputed hidden state of element (slot, c): hidden = gelu(gate) ⊙ up and the
// weighted hidden = w · hidden, w the slot's route weight.
DGEMMA_HOST_DEVICE inline void gatedGeluWeightedElement(const float* gateUp, const float* weights,
                                                        const int64_t* routeOfSlot, float* hidden, float* weighted,
                                                        int64_t inner, int64_t element) {
  const int64_t slot = element / inner, c = element - slot * inner;
  const float* row = gateUp + slot * 2 * inner;
  const float state = geluTanh(row[c]) * row[inner + c];
  hidden[element] = state;
  weighted[element] = weights[routeOfSlot[slot]] * state;
}

// With dState = w · dHidden: dGate = dState · up · gelu'(gate), dUp = dState · gelu(gate), into the
// slot's [dGate | dUp] row.
DGEMMA_HOST_DEVICE inline void gatedGeluBackwardElement(const float* gateUp, const float* dHidden, const float* weights,
                                                        const int64_t* routeOfSlot, float* dGateUp, int64_t inner,
                                                        int64_t element) {
  const int64_t slot = element / inner, c = element - slot * inner;
  const float* row = gateUp + slot * 2 * inner;
  float* dRow = dGateUp + slot * 2 * inner;
  const float gate = row[c];
  const float dState = weights[routeOfSlot[slot]] * dHidden[element];
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

// dw of a route: Σ_c hidden[slot, c] · (dy D)[slot, c] in order (0 for a route without a slot).
DGEMMA_HOST_DEVICE inline void routeWeightGradient(const float* hidden, const float* dOutputDown,
                                                   const int64_t* slotOfRoute, float* dWeights, int64_t inner,
                                                   int64_t route) {
  const int64_t slot = slotOfRoute[route];
  float sum = 0.0f;
  if (slot >= 0)
    for (int64_t c = 0; c < inner; ++c) sum += hidden[slot * inner + c] * dOutputDown[slot * inner + c];
  dWeights[route] = sum;
}

}  // namespace dgemma::moe_experts
