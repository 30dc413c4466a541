// The per-element arithmetic and the row reduction of the CUDA cross-entropy kernels
// (cross_entropy/cuda.cu), written once for the device and the host, in the order and precision of
// the CPU kernel (cross_entropy/cpu.cpp): the soft-cap in f32, z = capped logit + bonus at the
// bonus id in f64, the row max and Σ exp(z − max) in f64 with each exp in f32, the loss and the
// gradient. The CPU unit test (test/unit/kernels/CrossEntropyMathTest.cpp) runs them in a host
// emulation of the kernels' strided per-thread partials and block reduction and checks it against
// the CPU kernel, so the math is verified without a GPU.
#pragma once

#include <cmath>
#include <cstdint>

#ifndef DGEMMA_HOST_DEVICE
#if defined(__CUDACC__)
#define DGEMMA_HOST_DEVICE __host__ __device__
#else
#define DGEMMA_HOST_DEVICE
#endif
#endif

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

}  // namespace dgemma::cross_entropy
