// One element of the AdamW update (docs/kernels.md, "Optimizer kernel"), shared by the CPU kernel (cpu.cpp) and
// the CUDA kernel (cuda.cu) so that both evaluate the same expression in the same order: every step
// is one IEEE operation (multiply, add, divide, sqrt) that rounds alike on the host and on the device
// (the CUDA kernels are built without FMA contraction, see CMakeLists.txt), so the two backends'
// updates agree bit for bit. Plain C++ when not compiled by nvcc.
#pragma once

#include <cmath>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::optimizer {

// The attributes in the data type T, rounded once; keep = 1 − beta is computed in f64 first.
template <typename T>
struct AdamwAttributes {
  T beta1, beta2, keep1, keep2, epsilon, weightDecay;
};

template <typename T>
inline AdamwAttributes<T> adamwAttributes(double beta1, double beta2, double epsilon, double weightDecay) {
  return {static_cast<T>(beta1),   static_cast<T>(beta2),   static_cast<T>(1.0 - beta1),
          static_cast<T>(1.0 - beta2), static_cast<T>(epsilon), static_cast<T>(weightDecay)};
}

// The step's run-time scalar inputs, as read from their rank-0 buffers.
template <typename T>
struct AdamwStepScalars {
  T gradScale, lr, correction1, correction2;
};

template <typename T>
struct AdamwElement {
  T param, firstMoment, secondMoment;
};

// g = grad · grad_scale, m = β1 m + (1 − β1) g, v = β2 v + (1 − β2) g², p' = p − lr ((m / bc1) /
// (√(v / bc2) + ε) + wd p).
template <typename T>
DGEMMA_HOST_DEVICE inline AdamwElement<T> adamwUpdate(const AdamwAttributes<T>& a, const AdamwStepScalars<T>& s,
                                                      T param, T grad, T firstMoment, T secondMoment) {
  using std::sqrt;
  const T g = grad * s.gradScale;
  const T m = a.beta1 * firstMoment + a.keep1 * g;
  const T v = a.beta2 * secondMoment + a.keep2 * (g * g);
  const T step = (m / s.correction1) / (sqrt(v / s.correction2) + a.epsilon) + a.weightDecay * param;
  return {param - s.lr * step, m, v};
}

}  // namespace dgemma::optimizer
