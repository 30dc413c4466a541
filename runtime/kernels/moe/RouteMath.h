// One token of moe_route (docs/kernels.md, "Model kernels"): the max-subtracted softmax over all experts,
// the top k by probability (ties to the lower expert id, listed in descending order) and the
// renormalised, scaled weights, in the kernel's precision T. The CUDA kernel (cuda.cu) runs it per
// token; test/unit/kernels/MoeRouteMathTest.cpp checks it on the host against the CPU kernel, bit for
// bit. On the device exp is libdevice's, a few ulp from libm's, so the GPU's probabilities and
// weights differ from the CPU's in their last bits and only a near-tie (within those bits) could
// rank differently. Plain C++ when not compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/HostDevice.h"
#include "runtime/kernels/KernelElements.h"

namespace dgemma::moe_route {

// probabilities[e] = exp(row[e] − max) / Σ, the sum in expert order.
template <typename T>
DGEMMA_HOST_DEVICE inline void softmax(const T* row, int64_t experts, T* probabilities) {
  using std::exp;
  T maximum = row[0];
  for (int64_t e = 1; e < experts; ++e) maximum = row[e] > maximum ? row[e] : maximum;
  T sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    probabilities[e] = exp(row[e] - maximum);
    sum += probabilities[e];
  }
  for (int64_t e = 0; e < experts; ++e) probabilities[e] /= sum;
}

// Whether expert a ranks before expert b: descending probability, then ascending id (a total order
// on finite values, so the choice does not depend on the selection algorithm).
template <typename T>
DGEMMA_HOST_DEVICE inline bool ranksBefore(const T* probabilities, int64_t a, int64_t b) {
  return probabilities[a] > probabilities[b] || (probabilities[a] == probabilities[b] && a < b);
}

// The top k experts in rank order, then weights[j] = (P[idx_j] / Σ_j P[idx_j]) · scale[idx_j], the
// sum in listed order. `taken` is scratch of `experts` flags.
template <typename T>
DGEMMA_HOST_DEVICE inline void topKWeights(const T* probabilities, const T* expertScale, int64_t experts, int64_t topK,
                                           bool* taken, T* weights, int64_t* indices) {
  for (int64_t e = 0; e < experts; ++e) taken[e] = false;
  for (int64_t j = 0; j < topK; ++j) {
    int64_t best = -1;
    for (int64_t e = 0; e < experts; ++e)
      if (!taken[e] && (best < 0 || ranksBefore(probabilities, e, best))) best = e;
    DGEMMA_CUDA_BOUNDS(best, experts);  // none left to take when topK > experts
    taken[best] = true;
    indices[j] = best;
  }
  T chosen = 0;
  for (int64_t j = 0; j < topK; ++j) chosen += probabilities[indices[j]];
  for (int64_t j = 0; j < topK; ++j) weights[j] = probabilities[indices[j]] / chosen * expertScale[indices[j]];
}

// moe_route_backward for one token whose softmax is `probabilities`: with S = Σ P over the chosen
// experts, dP_j = dw_j scale_j / S − Σ_i dw_i scale_i P_i / S² (0 for the others) and dlogits =
// P ⊙ (dP − Σ P dP); scaleTerms[j] = dw_j P_j / S, the token's term of dscale[idx_j] (the caller sums
// them in route order). `dProbabilities` is scratch of `experts` values.
template <typename T>
DGEMMA_HOST_DEVICE inline void routeBackward(const T* probabilities, const T* expertScale, const int64_t* chosen,
                                             const T* dw, int64_t experts, int64_t topK, T* dProbabilities,
                                             T* dLogits, T* scaleTerms) {
  T selected = 0;
  for (int64_t j = 0; j < topK; ++j) {
    DGEMMA_CUDA_BOUNDS(chosen[j], experts);  // expert ids from the indices input
    selected += probabilities[chosen[j]];
  }
  T shared = 0;
  for (int64_t j = 0; j < topK; ++j) shared += dw[j] * expertScale[chosen[j]] * probabilities[chosen[j]];
  shared /= selected * selected;
  for (int64_t e = 0; e < experts; ++e) dProbabilities[e] = 0;
  for (int64_t j = 0; j < topK; ++j) {
    dProbabilities[chosen[j]] += dw[j] * expertScale[chosen[j]] / selected - shared;
    scaleTerms[j] = dw[j] * probabilities[chosen[j]] / selected;
  }
  T expected = 0;
  for (int64_t e = 0; e < experts; ++e) expected += probabilities[e] * dProbabilities[e];
  for (int64_t e = 0; e < experts; ++e) dLogits[e] = probabilities[e] * (dProbabilities[e] - expected);
}

}  // namespace dgemma::moe_route
