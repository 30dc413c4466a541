// The per-element arithmetic and the row reduction of the CUDA cross-entropy kernels
// (cross_entropy/cuda.cu), written once for the device and the host, in the order and precision of
// the CPU kernel (cross_entropy/cpu.cpp): the soft-cap in f32, z = capped logit + bonus at the
// bonus id in f64, the row max and Σ exp(z − max) in f64 with each exp in f32, the loss and the
// gradient; and what a block does for one row, as __host__ __device__ templates over the block. On
// the device `Block` is the CUDA block (thread index, block size, f64 block reductions); the CPU
// unit test (test/unit/kernels/CrossEntropyMathTest.cpp) runs the same row bodies on the host with
// blocks of one and of several emulated threads and checks them against the CPU kernel, so the
// kernels' code is verified without a GPU.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/KernelElements.h"

#include "runtime/kernels/HostDevice.h"

namespace dgemma::cross_entropy {

// An id tensor of either integer width, read as int64.
struct IdTensor {
  const void* data = nullptr;
  bool wide = true;  // i64, else i32

  DGEMMA_HOST_DEVICE int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(data)[i] : static_cast<const int32_t*>(data)[i];
  }
};

DGEMMA_HOST_DEVICE inline bool idInVocabulary(int64_t id, int64_t vocabulary) { return id >= 0 && id < vocabulary; }

// tanh(x / c), the factor of the soft-cap's derivative 1 − tanh², and the capped logit c · tanh(x / c),
// each an f32 operation as the div, tanh and mul ops the kernel replaces.
DGEMMA_HOST_DEVICE inline float squash(float x, float cap) { return tanhf(x / cap); }
DGEMMA_HOST_DEVICE inline float cappedFromSquashed(float squashed, float cap) { return squashed * cap; }

// One row's bonus: `bonus` added to z at `id` (-1: no bonus).
struct RowBonus {
  int64_t id = -1;
  double bonus = 0.0;
};

// z_j in f64: the (capped) logit plus the row's bonus at its id.
DGEMMA_HOST_DEVICE inline double zOf(float logit, int64_t j, RowBonus bonus) {
  return static_cast<double>(logit) + (j == bonus.id ? bonus.bonus : 0.0);
}

// exp(z − max), the exponent rounded to f32 and the exp taken in f32 as the CPU kernel does.
DGEMMA_HOST_DEVICE inline float expTerm(double z, double maximum) { return expf(static_cast<float>(z - maximum)); }

// The block reduction's combines: partial maxima and partial sums of one row.
DGEMMA_HOST_DEVICE inline double combineMaximum(double a, double b) { return a > b ? a : b; }
DGEMMA_HOST_DEVICE inline double combineSum(double a, double b) { return a + b; }

// loss = logsumexp(z) − z[target] = max + log(sum) − z[target].
DGEMMA_HOST_DEVICE inline double lossOf(double maximum, double sum, double zTarget) {
  return maximum + log(sum) - zTarget;
}

// grad_output · softmax(z)_j for j ≠ target: the f32 exp times grad_output / sum in f64, rounded once.
DGEMMA_HOST_DEVICE inline float gradientOf(float term, double gradOverSum) {
  return static_cast<float>(static_cast<double>(term) * gradOverSum);
}

// The target's grad_output · (p − 1), with p from z itself in f64 so that p − 1 keeps its digits
// when p is near 1.
DGEMMA_HOST_DEVICE inline float targetGradientOf(double gradOutput, double zTarget, double maximum, double sum) {
  return static_cast<float>(gradOutput * (exp(zTarget - maximum) / sum - 1.0));
}

// The soft-cap's chain rule: gradient · (1 − tanh²(x / c)), in f32.
DGEMMA_HOST_DEVICE inline float throughCap(float gradient, float squashed) {
  return gradient * (1.0f - squashed * squashed);
}

// ---- the kernels' row bodies -------------------------------------------------------------------------

// The inputs both kernels read.
template <typename T>
struct RowInputs {
  const T* logits;
  int64_t rows;
  int64_t vocabulary;
  IdTensor targets;
  IdTensor bonusIds;  // data null when there is no bonus
  const T* bonus;     // null when there is no bonus
  float cap;          // 0: none

  DGEMMA_HOST_DEVICE RowBonus bonusOf(int64_t r) const {
    if (bonus == nullptr) return {};
    return {bonusIds[r], static_cast<double>(kernels::loadFloat(bonus, r))};
  }
  // z_j of row r; `squashed` (when not null) receives tanh(x / c) for the backward (0 without a cap).
  DGEMMA_HOST_DEVICE double z(int64_t r, int64_t j, RowBonus rowBonus, float* squashed = nullptr) const {
    DGEMMA_CUDA_BOUNDS(r * vocabulary + j, rows * vocabulary);
    float logit = kernels::loadFloat(logits, r * vocabulary + j);
    if (cap > 0.0f) {
      const float s = squash(logit, cap);
      if (squashed != nullptr) *squashed = s;
      logit = cappedFromSquashed(s, cap);
    }
    return zOf(logit, j, rowBonus);
  }
};

// Row r's max and Σ exp(z − max), every thread of the block getting both: each thread's partials over
// the columns j = thread + n · threads, combined by the block's reductions.
template <typename Block, typename T>
DGEMMA_HOST_DEVICE void rowStatistics(const Block& block, const RowInputs<T>& in, int64_t r, RowBonus rowBonus,
                                      double& maximum, double& sum) {
  double partialMax = -INFINITY;
  for (int64_t j = block.thread(); j < in.vocabulary; j += block.threads())
    partialMax = combineMaximum(partialMax, in.z(r, j, rowBonus));
  maximum = block.reduceMaximum(partialMax);
  double partialSum = 0.0;
  for (int64_t j = block.thread(); j < in.vocabulary; j += block.threads())
    partialSum += expTerm(in.z(r, j, rowBonus), maximum);
  sum = block.reduceSum(partialSum);
}

// The forward for row r: the loss, written by thread 0.
template <typename Block, typename T>
DGEMMA_HOST_DEVICE void lossRow(const Block& block, const RowInputs<T>& in, int64_t r, T* loss) {
  const RowBonus rowBonus = in.bonusOf(r);
  double maximum, sum;
  rowStatistics(block, in, r, rowBonus, maximum, sum);
  if (block.thread() == 0) {
    const int64_t target = in.targets[r];
    DGEMMA_CUDA_BOUNDS(target, in.vocabulary);
    kernels::storeFloat(loss, r, static_cast<float>(lossOf(maximum, sum, in.z(r, target, rowBonus))));
  }
}

// The backward for row r: every grad_logits element of the row, written once by its thread.
template <typename Block, typename T>
DGEMMA_HOST_DEVICE void gradientRow(const Block& block, const RowInputs<T>& in, int64_t r, const T* gradOutput,
                                    T* gradLogits) {
  const RowBonus rowBonus = in.bonusOf(r);
  double maximum, sum;
  rowStatistics(block, in, r, rowBonus, maximum, sum);
  const double g = static_cast<double>(kernels::loadFloat(gradOutput, r));
  const double gradOverSum = g / sum;
  const int64_t target = in.targets[r];
  DGEMMA_CUDA_BOUNDS(target, in.vocabulary);
  for (int64_t j = block.thread(); j < in.vocabulary; j += block.threads()) {
    float squashed = 0.0f;
    const double z = in.z(r, j, rowBonus, &squashed);
    float gradient = j == target ? targetGradientOf(g, z, maximum, sum) : gradientOf(expTerm(z, maximum), gradOverSum);
    if (in.cap > 0.0f) gradient = throughCap(gradient, squashed);
    kernels::storeFloat(gradLogits, r * in.vocabulary + j, gradient);
  }
}

}  // namespace dgemma::cross_entropy
