// The mixture-of-experts block: moe_route (softmax over all experts, top-k, renormalise, per-expert
// scale) and moe_experts (dropless routed experts, each a gated GELU MLP, combined by the weights).
// The experts kernels may hold one block of the experts, [expert_offset, expert_offset + E): routes to
// the other experts take no slot, so they add nothing to y or dx and get zero weight gradients.
#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <memory>
#include <numeric>
#include <type_traits>
#include <vector>

#include "support/Error.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/moe/Contract.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/kernels/matmul/CpuGemm.h"
#include "runtime/kernels/moe/ExpertMath.h"

namespace dgemma {
namespace {

using expert_math::gatedGeluBackwardRow;
using expert_math::gatedGeluRow;
using expert_math::gatedGeluWeightedRow;
using cpu::gemm;

// ---------------------------------------------------------------------------------------------
// moe_route

// The max-subtracted softmax of one token's router logits over all experts, shared by the router
// and its backward kernel (which recomputes it).
template <typename T>
void routerSoftmax(const T* row, int64_t experts, T* probabilities) {
  const T maximum = *std::max_element(row, row + experts);
  T sum = 0;
  for (int64_t e = 0; e < experts; ++e) {
    probabilities[e] = std::exp(row[e] - maximum);
    sum += probabilities[e];
  }
  for (int64_t e = 0; e < experts; ++e) probabilities[e] /= sum;
}

// T is also the precision of the softmax and the renormalisation, as the contract says.
template <typename T>
class MoeRouteKernel final : public Kernel {
 public:
  explicit MoeRouteKernel(MoeRouteContract route) : route_(route) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* logits = inputs[0].as<const T>();
    const T* expertScale = inputs[1].as<const T>();
    T* weights = outputs[0].as<T>();
    int64_t* indices = outputs[1].as<int64_t>();
    const int64_t tokens = route_.tokens, experts = route_.experts, topK = route_.topK;
    cpu::parallelFor(context, tokens, cpu::rowGrain(experts), [&](int64_t begin, int64_t end) {
      std::vector<T> probabilities(experts);
      std::vector<int64_t> ranking(experts);
      for (int64_t token = begin; token < end; ++token) {
        routerSoftmax(logits + token * experts, experts, probabilities.data());

        // Descending probability, equal probabilities by ascending expert id: a total order on
        // finite values, so the choice and its listing do not depend on the sort algorithm.
        std::iota(ranking.begin(), ranking.end(), int64_t{0});
        std::partial_sort(ranking.begin(), ranking.begin() + topK, ranking.end(), [&](int64_t a, int64_t b) {
          return probabilities[a] > probabilities[b] || (probabilities[a] == probabilities[b] && a < b);
        });
        T chosen = 0;
        for (int64_t j = 0; j < topK; ++j) chosen += probabilities[ranking[j]];
        for (int64_t j = 0; j < topK; ++j) {
          const int64_t expert = ranking[j];
          weights[token * topK + j] = probabilities[expert] / chosen * expertScale[expert];
          indices[token * topK + j] = expert;
        }
      }
    });
  }

 private:
  MoeRouteContract route_;
};

std::unique_ptr<Kernel> createMoeRouteKernel(const KernelSignature& signature) {
  const MoeRouteContract c = parseMoeRouteContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<MoeRouteKernel<double>>(c);
  return std::make_unique<MoeRouteKernel<float>>(c);
}

// ---------------------------------------------------------------------------------------------
// moe_experts

// Which slot of the expert-sorted row blocks each route (token, j) takes; only the routes to experts
// of this block take one.
struct RouteGrouping {
  static constexpr int64_t kNoSlot = -1;  // a route to an expert another block holds
  std::vector<int64_t> firstSlot;    // local expert e's routes take slots [firstSlot[e], firstSlot[e + 1])
  std::vector<int64_t> slotOfRoute;  // indexed by token * k + j
  std::vector<int64_t> tokenOfSlot;
  std::vector<int64_t> routeOfSlot;
  int64_t slots() const { return firstSlot.back(); }
};

// The local expert of a route, or -1 when another block holds it.
int64_t localExpert(int64_t index, const MoeExpertsContract& block) {
  const int64_t expert = index - block.expertOffset;
  return expert >= 0 && expert < block.experts ? expert : -1;
}

// Counts the routes per local expert, then hands out slots in (token, j) order, so each expert's rows
// form one contiguous block and the grouping depends on the indices alone.
RouteGrouping groupRoutesByExpert(const int64_t* indices, int64_t routes, const MoeExpertsContract& block) {
  RouteGrouping grouping;
  grouping.firstSlot.assign(block.experts + 1, 0);
  for (int64_t route = 0; route < routes; ++route)
    if (const int64_t expert = localExpert(indices[route], block); expert >= 0) ++grouping.firstSlot[expert + 1];
  std::partial_sum(grouping.firstSlot.begin(), grouping.firstSlot.end(), grouping.firstSlot.begin());
  std::vector<int64_t> nextSlot(grouping.firstSlot.begin(), grouping.firstSlot.end() - 1);
  grouping.slotOfRoute.assign(routes, RouteGrouping::kNoSlot);
  grouping.tokenOfSlot.resize(grouping.slots());
  grouping.routeOfSlot.resize(grouping.slots());
  for (int64_t route = 0; route < routes; ++route) {
    const int64_t expert = localExpert(indices[route], block);
    if (expert < 0) continue;
    const int64_t slot = nextSlot[expert]++;
    grouping.slotOfRoute[route] = slot;
    grouping.tokenOfSlot[slot] = route / block.topK;
    grouping.routeOfSlot[slot] = route;
  }
  return grouping;
}

// Below this many multiply-adds in all the experts' products together, the experts run one after
// the other: waking the pool would cost more than running them side by side saves.
constexpr int64_t kSideBySideMultiplyAdds = int64_t{1} << 21;

// Calls body(expert, firstSlot, rows) once for each expert with at least one route; `multiplyAddsPerRow`
// is the products' work per slot. Each body runs all of its expert's work, whose products are
// single-threaded OpenBLAS calls (SingleThreadedProducts) in every mode: the experts run side by side
// on the pool, each on one thread, the next expert going to the first free thread. OpenBLAS's own
// threads would split each small product in two and spin between them, and its results would depend
// on the thread count; here an expert's results are the same bytes whatever runs it, serially or on
// a pool of any size (test/unit/kernels/MoeTest.cpp, PooledProductsTest.cpp).
template <typename Body>
void forEachUsedExpert(ExecContext& context, const RouteGrouping& grouping, int64_t experts, int64_t multiplyAddsPerRow,
                       Body&& body) {
  std::vector<int64_t> used;
  for (int64_t expert = 0; expert < experts; ++expert)
    if (grouping.firstSlot[expert + 1] > grouping.firstSlot[expert]) used.push_back(expert);
  const SingleThreadedProducts singleThreaded;
  auto runExpert = [&](int64_t expert) {
    const int64_t firstSlot = grouping.firstSlot[expert];
    body(expert, firstSlot, static_cast<int>(grouping.firstSlot[expert + 1] - firstSlot));
  };
  const int64_t workers = context.threads == nullptr ? 1 : std::min<int64_t>(context.threads->size(), used.size());
  if (workers <= 1 || grouping.slots() * multiplyAddsPerRow < kSideBySideMultiplyAdds) {
    for (int64_t expert : used) runExpert(expert);
    return;
  }
  // The largest experts first, so that the last ones to start are short.
  std::stable_sort(used.begin(), used.end(), [&](int64_t a, int64_t b) {
    return grouping.firstSlot[a + 1] - grouping.firstSlot[a] > grouping.firstSlot[b + 1] - grouping.firstSlot[b];
  });
  std::atomic<size_t> next{0};
  cpu::parallelFor(context, workers, 1, [&](int64_t, int64_t) {
    for (size_t i = next++; i < used.size(); i = next++) runExpert(used[i]);
  });
}

template <typename T>
void scaleBlock(T* values, int64_t count, double scale) {
  for (int64_t i = 0; i < count; ++i) values[i] *= static_cast<T>(scale);
}

// One expert's adapter pair: A [r, fanIn] and B [fanOut, r] (row-major), the expert's slices of the
// adapter inputs; null without the pair.
template <typename T>
struct ExpertAdapter {
  const T* a = nullptr;
  const T* b = nullptr;
  explicit operator bool() const { return a != nullptr; }
};

template <typename T>
ExpertAdapter<T> adapterOf(const std::vector<TensorRef>& inputs, int input, int64_t expert, int64_t rank, int64_t fanIn,
                           int64_t fanOut) {
  if (input < 0) return {};
  return {inputs[input].as<const T>() + expert * rank * fanIn,
          inputs[input + 1].as<const T>() + expert * fanOut * rank};
}

// rows × fanOut of `out` (leading dimension ldOut) += s · (in A^T) B^T, with in [rows, fanIn] (leading
// dimension ldIn): T = s · in A^T goes to `scaled` [rows, r] first (the backward reuses it), so W + s·BA
// is never formed and the adapter costs two rank-r products.
template <typename T>
void addAdapterProduct(const ExpertAdapter<T>& adapter, int rows, int64_t rank, int64_t fanIn, int64_t fanOut,
                       double scale, const T* in, int64_t ldIn, T* scaled, T* out, int64_t ldOut) {
  gemm(false, true, rows, rank, fanIn, in, ldIn, adapter.a, fanIn, scaled, rank);
  scaleBlock(scaled, rows * rank, scale);
  gemm(false, true, rows, fanOut, rank, scaled, rank, adapter.b, rank, out, ldOut, T(1));
}

template <typename T>
class MoeExpertsKernel final : public Kernel {
 public:
  MoeExpertsKernel(std::string where, MoeExpertsContract geometry) : where_(std::move(where)), geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    const T* weights = inputs[1].as<const T>();
    const int64_t* indices = inputs[2].as<const int64_t>();
    const T* gateUp = inputs[3].as<const T>();
    const T* down = inputs[4].as<const T>();
    T* y = outputs[0].as<T>();
    const MoeExpertsContract& g = geometry_;
    T* keptRows = g.gateUpRows ? outputs[1].as<T>() : nullptr;  // gate_up_rows [N·k, 2I], by route
    const int64_t routes = g.tokens * g.topK;
    checkIndices(indices, routes);
    if (g.hidden == 0) {  // y has no elements, and BLAS rejects a leading dimension of 0
      if (keptRows != nullptr) std::fill_n(keptRows, routes * 2 * g.expertHidden, T(0));  // empty sums
      return;
    }
    if (g.expertHidden == 0) {  // every expert's output is an empty sum; gate_up_rows has no elements
      std::fill(y, y + g.tokens * g.hidden, T(0));
      return;
    }

    const RouteGrouping grouping = groupRoutesByExpert(indices, routes, g);
    const int64_t slots = grouping.slots();
    const int64_t hidden = g.hidden, expertHidden = g.expertHidden, gateUpWidth = 2 * g.expertHidden;
    // Every element of these blocks is written before it is read, so they start uninitialised.
    const auto expertInput = std::make_unique_for_overwrite<T[]>(slots * hidden);
    const auto gateUpOutput = std::make_unique_for_overwrite<T[]>(slots * gateUpWidth);
    const auto expertOutput = std::make_unique_for_overwrite<T[]>(slots * hidden);
    const int64_t rank = g.loraRank;
    const auto lowRank = std::make_unique_for_overwrite<T[]>(rank > 0 ? slots * rank : 0);  // s · X A^T

    cpu::parallelFor(context, slots, cpu::rowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot)
        std::copy_n(x + grouping.tokenOfSlot[slot] * hidden, hidden, expertInput.get() + slot * hidden);
    });
    // The kept rows of the routes to other blocks' experts; the experts below write the others.
    if (keptRows != nullptr)
      for (int64_t route = 0; route < routes; ++route)
        if (grouping.slotOfRoute[route] == RouteGrouping::kNoSlot)
          std::fill_n(keptRows + route * gateUpWidth, gateUpWidth, T(0));
    // Per expert: the gate/up product, its rows kept by route when asked (each expert writes only its
    // own routes' rows), gelu_tanh(gate) ⊙ up over the gate half of each row (the down product reads it
    // with leading dimension 2I), then the down product.
    const int64_t multiplyAddsPerRow = hidden * (gateUpWidth + expertHidden) + rank * (2 * hidden + 3 * expertHidden);
    forEachUsedExpert(context, grouping, g.experts, multiplyAddsPerRow, [&](int64_t expert, int64_t firstSlot, int rows) {
      T* gateUpRows = gateUpOutput.get() + firstSlot * gateUpWidth;
      gemm(false, true, rows, static_cast<int>(gateUpWidth), static_cast<int>(hidden), expertInput.get() + firstSlot * hidden,
           static_cast<int>(hidden), gateUp + expert * gateUpWidth * hidden, static_cast<int>(hidden), gateUpRows,
           static_cast<int>(gateUpWidth));
      T* expertLowRank = lowRank.get() + firstSlot * rank;
      if (auto adapter = adapterOf<T>(inputs, g.loraGateUpInput, expert, rank, hidden, gateUpWidth))
        addAdapterProduct(adapter, rows, rank, hidden, gateUpWidth, g.loraScale, expertInput.get() + firstSlot * hidden,
                          hidden, expertLowRank, gateUpRows, gateUpWidth);
      for (int row = 0; row < rows; ++row) {
        T* slotRow = gateUpRows + row * gateUpWidth;
        if (keptRows != nullptr)
          std::copy_n(slotRow, gateUpWidth, keptRows + grouping.routeOfSlot[firstSlot + row] * gateUpWidth);
        gatedGeluRow(slotRow, expertHidden);
      }
      gemm(false, true, rows, static_cast<int>(hidden), static_cast<int>(expertHidden), gateUpRows,
           static_cast<int>(gateUpWidth), down + expert * hidden * expertHidden, static_cast<int>(expertHidden),
           expertOutput.get() + firstSlot * hidden, static_cast<int>(hidden));
      if (auto adapter = adapterOf<T>(inputs, g.loraDownInput, expert, rank, expertHidden, hidden))
        addAdapterProduct(adapter, rows, rank, expertHidden, hidden, g.loraScale, gateUpRows, gateUpWidth,
                          expertLowRank, expertOutput.get() + firstSlot * hidden, hidden);
    });
    // Each token sums its own routes in order of j, so y does not depend on the thread count.
    cpu::parallelFor(context, g.tokens, cpu::rowGrain(g.topK * hidden), [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        T* yRow = y + token * hidden;
        std::fill(yRow, yRow + hidden, T(0));
        for (int64_t j = 0; j < g.topK; ++j) {
          const int64_t route = token * g.topK + j;
          const int64_t slot = grouping.slotOfRoute[route];
          if (slot == RouteGrouping::kNoSlot) continue;
          const T weight = weights[route];
          const T* output = expertOutput.get() + slot * hidden;
          for (int64_t h = 0; h < hidden; ++h) yRow[h] += weight * output[h];
        }
      }
    });
  }

 private:
  // Serially and before any work, so the error names the first bad index in (token, j) order. Only a
  // negative index is no expert at all: one past this block's experts may be another block's.
  void checkIndices(const int64_t* indices, int64_t routes) const {
    for (int64_t route = 0; route < routes; ++route)
      if (indices[route] < 0)
        throw RuntimeError(where_ + ": expert index " + std::to_string(indices[route]) + " at indices[" +
                           std::to_string(route / geometry_.topK) + ", " + std::to_string(route % geometry_.topK) +
                           "] is negative, not an expert");
  }

  std::string where_;  // run-time errors name the step as the plan loader does
  MoeExpertsContract geometry_;
};

// The experts' products are BLAS GEMMs of int dimensions; an expert's block has at most N·k rows.
void expectBlasRange(const KernelSignature& signature, const MoeExpertsContract& c) {
  if (c.tokens * c.topK > INT_MAX || 2 * c.expertHidden > INT_MAX || c.hidden > INT_MAX)
    failSignature(signature, "matrix dimensions exceed the BLAS integer range");
}

std::unique_ptr<Kernel> createMoeExpertsKernel(const KernelSignature& signature) {
  const MoeExpertsContract c = parseMoeExpertsContract(signature, {DType::F32, DType::F64});
  expectBlasRange(signature, c);
  if (c.dtype == DType::F64) return std::make_unique<MoeExpertsKernel<double>>(signature.where, c);
  return std::make_unique<MoeExpertsKernel<float>>(signature.where, c);
}

// ---------------------------------------------------------------------------------------------
// moe_route_backward: with P the softmax, S = Σ_selected P and w_j = P_j / S · scale_j for the
// selected experts, the weight gradients dw give
//   dscale_e = Σ_tokens dw_j P_j / S,   dP_j = dw_j scale_j / S − Σ_i dw_i scale_i P_i / S²,
//   dlogits = P ⊙ (dP − Σ_e P_e dP_e)   (dP is 0 for unselected experts).

template <typename T>
class MoeRouteBackwardKernel final : public Kernel {
 public:
  explicit MoeRouteBackwardKernel(MoeRouteContract route) : route_(route) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* logits = inputs[0].as<const T>();
    const T* expertScale = inputs[1].as<const T>();
    const int64_t* indices = inputs[2].as<const int64_t>();
    const T* dWeights = inputs[3].as<const T>();
    T* dLogits = outputs[0].as<T>();
    T* dScale = outputs[1].as<T>();
    const int64_t tokens = route_.tokens, experts = route_.experts, topK = route_.topK;
    // The per-token scale contributions, summed afterwards in token order (no shared writes).
    std::vector<T> scaleTerms(tokens * topK);
    cpu::parallelFor(context, tokens, cpu::rowGrain(experts), [&](int64_t begin, int64_t end) {
      std::vector<T> probabilities(experts), dProbabilities(experts);
      for (int64_t token = begin; token < end; ++token) {
        routerSoftmax(logits + token * experts, experts, probabilities.data());
        const int64_t* chosen = indices + token * topK;
        const T* dw = dWeights + token * topK;
        T selected = 0;
        for (int64_t j = 0; j < topK; ++j) selected += probabilities[chosen[j]];
        T shared = 0;
        for (int64_t j = 0; j < topK; ++j) shared += dw[j] * expertScale[chosen[j]] * probabilities[chosen[j]];
        shared /= selected * selected;
        std::fill(dProbabilities.begin(), dProbabilities.end(), T(0));
        for (int64_t j = 0; j < topK; ++j) {
          dProbabilities[chosen[j]] += dw[j] * expertScale[chosen[j]] / selected - shared;
          scaleTerms[token * topK + j] = dw[j] * probabilities[chosen[j]] / selected;
        }
        T expected = 0;
        for (int64_t e = 0; e < experts; ++e) expected += probabilities[e] * dProbabilities[e];
        for (int64_t e = 0; e < experts; ++e) dLogits[token * experts + e] = probabilities[e] * (dProbabilities[e] - expected);
      }
    });
    std::fill(dScale, dScale + experts, T(0));
    for (int64_t route = 0; route < tokens * topK; ++route) dScale[indices[route]] += scaleTerms[route];
  }

 private:
  MoeRouteContract route_;
};

std::unique_ptr<Kernel> createMoeRouteBackwardKernel(const KernelSignature& signature) {
  const MoeRouteContract c = parseMoeRouteBackwardContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<MoeRouteBackwardKernel<double>>(c);
  return std::make_unique<MoeRouteBackwardKernel<float>>(c);
}

// ---------------------------------------------------------------------------------------------
// moe_experts_backward: per expert e, over the block of its R routes (rows in slot order) with
// inputs X [R, H], output gradients dY [R, H] and route weights w, taking GU = X [G_e; U_e]ᵀ,
// A = gelu(G), Hd = A ⊙ U (the expert output is O = Hd D_eᵀ, y += w O):
//   P = dY D_e,  dw = rowsum(Hd ⊙ P),  dD_e = dYᵀ (w ⊙ Hd),  dHd = w ⊙ P,
//   dG = dHd ⊙ U ⊙ gelu'(G),  dU = dHd ⊙ A,  d[G_e; U_e] = [dG dU]ᵀ X,  dX = [dG dU] [G_e; U_e].
// dw = rowsum(dY ⊙ O) = rowsum(Hd ⊙ dY D_e) needs no O, so the down product is not recomputed: five
// GEMMs per expert instead of six. With the forward's gate_up_rows (input 6), GU is read from them
// by route instead of recomputed: four GEMMs. The forward's product was this one (the same shapes,
// operands and slot layout, single-threaded), so the gradients are the same bytes either way.
// With adapters (scale s; T1 = s·X A1ᵀ, Q = s·dY B2, T2 = s·(w ⊙ Hd) A2ᵀ, dT1 = s·dPre B1, dPre = [dG dU]):
//   P += Q A2,  dA2 = Qᵀ (w ⊙ Hd),  dB2 = dYᵀ T2,  dB1 = dPreᵀ T1,  dA1 = dT1ᵀ X,  dX += dT1 A1;
// the adapters' gradients only ever take rank-r products, and a frozen base's gradients (outputs the
// step does not list) are skipped with their products.
// The products are BLAS GEMMs, the experts side by side (forEachUsedExpert); dx sums each token's
// routes in order of j, so the result does not depend on the thread count.

template <typename T>
class MoeExpertsBackwardKernel final : public Kernel {
 public:
  explicit MoeExpertsBackwardKernel(MoeExpertsContract geometry) : geometry_(geometry) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    const T* weights = inputs[1].as<const T>();
    const int64_t* indices = inputs[2].as<const int64_t>();
    const T* gateUp = inputs[3].as<const T>();
    const T* down = inputs[4].as<const T>();
    const T* dy = inputs[5].as<const T>();
    T* dx = outputs[0].as<T>();
    T* dWeights = outputs[1].as<T>();
    const MoeExpertsContract& g = geometry_;
    // Null where the step does not ask for them (a frozen base's, an absent adapter's).
    const auto output = [&](int index, int offset = 0) {
      return index < 0 ? nullptr : outputs[index + offset].as<T>();
    };
    T* dGateUp = output(g.gradGateUpOutput);
    T* dDown = output(g.gradDownOutput);
    T* dGateUpA = output(g.gradLoraGateUpOutput);
    T* dGateUpB = output(g.gradLoraGateUpOutput, 1);
    T* dDownA = output(g.gradLoraDownOutput);
    T* dDownB = output(g.gradLoraDownOutput, 1);
    const T* keptRows = g.gateUpRows ? inputs[6].as<const T>() : nullptr;  // gate_up_rows [N·k, 2I], by route
    const int64_t routes = g.tokens * g.topK, hidden = g.hidden, inner = g.expertHidden, width = 2 * inner;
    const int64_t rank = g.loraRank;
    // Each expert-weight gradient present, with its per-expert size: zeroed for an expert without routes.
    struct PerExpert {
      T* data;
      int64_t size;
    };
    const PerExpert weightGradients[] = {{dGateUp, width * hidden}, {dDown, hidden * inner}, {dGateUpA, rank * hidden},
                                         {dGateUpB, width * rank},  {dDownA, rank * inner},  {dDownB, hidden * rank}};
    std::fill_n(dx, g.tokens * hidden, T(0));
    if (routes == 0 || hidden == 0 || inner == 0) {
      for (const PerExpert& gradient : weightGradients)
        if (gradient.data != nullptr) std::fill_n(gradient.data, g.experts * gradient.size, T(0));
      std::fill_n(dWeights, routes, T(0));
      return;
    }
    const RouteGrouping grouping = groupRoutesByExpert(indices, routes, g);
    // A used expert's weight gradients are written whole by its products below; an unused one's are zero.
    for (int64_t e = 0; e < g.experts; ++e)
      if (grouping.firstSlot[e + 1] == grouping.firstSlot[e])
        for (const PerExpert& gradient : weightGradients)
          if (gradient.data != nullptr) std::fill_n(gradient.data + e * gradient.size, gradient.size, T(0));
    const int64_t slots = grouping.slots();
    const std::vector<int64_t>& routeOfSlot = grouping.routeOfSlot;
    // Routes to other blocks' experts keep a zero weight gradient: no slot below writes theirs.
    for (int64_t route = 0; route < routes; ++route)
      if (grouping.slotOfRoute[route] == RouteGrouping::kNoSlot) dWeights[route] = T(0);

    // Slot-ordered blocks: every element is written before it is read, so they start uninitialised.
    const auto block = [](int64_t count) { return std::make_unique_for_overwrite<T[]>(count); };
    const auto input = block(slots * hidden), dOutput = block(slots * hidden), dInput = block(slots * hidden);
    // GU in slot order when recomputed; the kept rows are read where they are.
    const auto gateUpOutput = block(keptRows != nullptr ? 0 : slots * width), dGateUpOutput = block(slots * width);
    const auto preActivations = [&](int64_t slot) -> const T* {
      return keptRows != nullptr ? keptRows + routeOfSlot[slot] * width : gateUpOutput.get() + slot * width;
    };
    const auto hiddenState = block(slots * inner), weightedHidden = block(slots * inner), dOutputDown = block(slots * inner);
    // The adapters' rank-r rows: s · X A1ᵀ (the forward's), and the scaled products of the gradients.
    const auto lowRankInput = block(rank > 0 ? slots * rank : 0), lowRankGradient = block(rank > 0 ? slots * rank : 0);
    cpu::parallelFor(context, slots, cpu::rowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t slot = begin; slot < end; ++slot) {
        const int64_t token = grouping.tokenOfSlot[slot];
        std::copy_n(x + token * hidden, hidden, input.get() + slot * hidden);
        std::copy_n(dy + token * hidden, hidden, dOutput.get() + slot * hidden);
      }
    });
    // Per expert, its five products (four with the kept rows, one fewer per base gradient not asked
    // for), the adapters' rank-r products, and the gated GELU rows between them.
    const int64_t multiplyAddsPerRow = hidden * ((keptRows != nullptr ? 0 : width) + 2 * inner + 2 * width) +
                                       rank * (3 * hidden + 3 * width + 3 * inner + 2 * hidden);
    forEachUsedExpert(context, grouping, g.experts, multiplyAddsPerRow, [&](int64_t e, int64_t first, int rows) {
      const T* GU = gateUp + e * width * hidden;
      const T* D = down + e * hidden * inner;
      const ExpertAdapter<T> gateUpAdapter = adapterOf<T>(inputs, g.loraGateUpInput, e, rank, hidden, width);
      const ExpertAdapter<T> downAdapter = adapterOf<T>(inputs, g.loraDownInput, e, rank, inner, hidden);
      const T* X = input.get() + first * hidden;
      const T* dY = dOutput.get() + first * hidden;
      T* lowX = lowRankInput.get() + first * rank;
      T* lowGradient = lowRankGradient.get() + first * rank;
      if (keptRows == nullptr)
        gemm(false, true, rows, int(width), int(hidden), X, int(hidden), GU, int(hidden),
             gateUpOutput.get() + first * width, int(width));
      // s · X A1ᵀ: dB1 needs it even where the kept rows hold the pre-activations.
      if (gateUpAdapter) {
        if (keptRows == nullptr)
          addAdapterProduct(gateUpAdapter, rows, rank, hidden, width, g.loraScale, X, hidden, lowX,
                            gateUpOutput.get() + first * width, width);
        else {
          gemm(false, true, rows, rank, hidden, X, hidden, gateUpAdapter.a, hidden, lowX, rank);
          scaleBlock(lowX, rows * rank, g.loraScale);
        }
      }
      for (int64_t slot = first; slot < first + rows; ++slot) {
        const T* gate = preActivations(slot);
        gatedGeluWeightedRow(gate, gate + inner, weights[routeOfSlot[slot]], hiddenState.get() + slot * inner,
                             weightedHidden.get() + slot * inner, inner);
      }
      const T* weightedActs = weightedHidden.get() + first * inner;
      if (dDown != nullptr)
        gemm(true, false, int(hidden), int(inner), rows, dY, int(hidden), weightedActs, int(inner),
             dDown + e * hidden * inner, int(inner));
      T* P = dOutputDown.get() + first * inner;  // dY D (+ s (dY B2) A2): the gradient at the hidden state
      gemm(false, false, rows, int(inner), int(hidden), dY, int(hidden), D, int(inner), P, int(inner));
      if (downAdapter) {
        // Q = s · dY B2 [rows, r]: dA2 = Qᵀ (w ⊙ Hd), and P += Q A2.
        gemm(false, false, rows, rank, hidden, dY, hidden, downAdapter.b, rank, lowGradient, rank);
        scaleBlock(lowGradient, rows * rank, g.loraScale);
        gemm(true, false, rank, inner, rows, lowGradient, rank, weightedActs, inner, dDownA + e * rank * inner, inner);
        gemm(false, false, rows, inner, rank, lowGradient, rank, downAdapter.a, inner, P, inner, T(1));
        // dB2 = dYᵀ (s · (w ⊙ Hd) A2ᵀ), the forward's low-rank rows weighted by the route.
        gemm(false, true, rows, rank, inner, weightedActs, inner, downAdapter.a, inner, lowGradient, rank);
        scaleBlock(lowGradient, rows * rank, g.loraScale);
        gemm(true, false, hidden, rank, rows, dY, hidden, lowGradient, rank, dDownB + e * hidden * rank, rank);
      }
      for (int64_t slot = first; slot < first + rows; ++slot) {
        const int64_t route = routeOfSlot[slot];
        dWeights[route] = cpu::dotProduct(hiddenState.get() + slot * inner, dOutputDown.get() + slot * inner, inner);
        const T* gate = preActivations(slot);
        T* dGate = dGateUpOutput.get() + slot * width;
        gatedGeluBackwardRow(gate, gate + inner, dOutputDown.get() + slot * inner, weights[route], dGate, dGate + inner,
                             inner);
      }
      const T* dPre = dGateUpOutput.get() + first * width;
      if (dGateUp != nullptr)
        gemm(true, false, int(width), int(hidden), rows, dPre, int(width), X, int(hidden), dGateUp + e * width * hidden,
             int(hidden));
      T* dX = dInput.get() + first * hidden;
      gemm(false, false, rows, int(hidden), int(width), dPre, int(width), GU, int(hidden), dX, int(hidden));
      if (gateUpAdapter) {
        // dB1 = dPreᵀ (s · X A1ᵀ); with dT = s · dPre B1: dA1 = dTᵀ X and dX += dT A1.
        gemm(true, false, width, rank, rows, dPre, width, lowX, rank, dGateUpB + e * width * rank, rank);
        gemm(false, false, rows, rank, width, dPre, width, gateUpAdapter.b, rank, lowGradient, rank);
        scaleBlock(lowGradient, rows * rank, g.loraScale);
        gemm(true, false, rank, hidden, rows, lowGradient, rank, X, hidden, dGateUpA + e * rank * hidden, hidden);
        gemm(false, false, rows, hidden, rank, lowGradient, rank, gateUpAdapter.a, hidden, dX, hidden, T(1));
      }
    });
    cpu::parallelFor(context, g.tokens, cpu::rowGrain(g.topK * hidden), [&](int64_t begin, int64_t end) {
      for (int64_t token = begin; token < end; ++token) {
        T* dxRow = dx + token * hidden;
        for (int64_t j = 0; j < g.topK; ++j) {
          const int64_t slot = grouping.slotOfRoute[token * g.topK + j];
          if (slot == RouteGrouping::kNoSlot) continue;
          const T* part = dInput.get() + slot * hidden;
          for (int64_t h = 0; h < hidden; ++h) dxRow[h] += part[h];
        }
      }
    });
  }

 private:
  MoeExpertsContract geometry_;
};

std::unique_ptr<Kernel> createMoeExpertsBackwardKernel(const KernelSignature& signature) {
  const MoeExpertsContract c = parseMoeExpertsBackwardContract(signature, {DType::F32, DType::F64});
  expectBlasRange(signature, c);
  if (c.dtype == DType::F64) return std::make_unique<MoeExpertsBackwardKernel<double>>(c);
  return std::make_unique<MoeExpertsBackwardKernel<float>>(c);
}

}  // namespace

void registerMoeCpuKernels(KernelRegistry& registry) {
  registry.add("moe_route", createMoeRouteKernel);
  registry.add("moe_experts", createMoeExpertsKernel);
  registry.add("moe_route_backward", createMoeRouteBackwardKernel);
  registry.add("moe_experts_backward", createMoeExpertsBackwardKernel);
}

}  // namespace dgemma
