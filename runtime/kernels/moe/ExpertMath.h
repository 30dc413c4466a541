// The arithmetic of one expert's gated GELU MLP on the CPU, shared by moe_experts
// (runtime/kernels/moe/cpu.cpp) and the expert-parallel moe_local_experts
// (runtime/kernels/moe_dispatch/cpu.cpp): the gated GELU rows with its derivative (the GEMMs are
// matmul/CpuGemm.h's; expert weight blocks are stored [out, in], so the forward products read them
// transposed in place).
#pragma once

#include <cstdint>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"

namespace dgemma::expert_math {

// The gated GELU of the expert MLPs row by row, and its derivative. These loops are the experts'
// arithmetic outside the GEMMs (a tanh per element), so their f32 instances are compiled in AVX2
// clones (see FastMath.h); the templates are always inlined so that each clone gets its own copy.

template <typename T>
[[gnu::always_inline]] inline T geluTanhDerivative(T x) {
  constexpr T kSqrtTwoOverPi = T(0.7978845608028654), kCubic = T(0.044715);
  const T t = cpu::fastTanh(kSqrtTwoOverPi * (x + kCubic * x * x * x));
  return T(0.5) * (T(1) + t) + T(0.5) * x * (T(1) - t * t) * kSqrtTwoOverPi * (T(1) + T(3) * kCubic * x * x);
}

// row[c] = gelu_tanh(row[c]) · row[n + c]: the gate half of a [gate | up] row is overwritten. One
// pointer, so the compiler sees the two halves n apart rather than two possibly equal pointers.
template <typename T>
[[gnu::always_inline]] inline void gatedGeluRowIn(T* row, int64_t n) {
  for (int64_t c = 0; c < n; ++c) row[c] = cpu::geluTanh(row[c]) * row[n + c];
}

// hidden[c] = gelu_tanh(gate[c]) · up[c] and weighted[c] = weight · hidden[c].
template <typename T>
[[gnu::always_inline]] inline void gatedGeluWeightedRowIn(const T* gate, const T* up, T weight, T* hidden, T* weighted,
                                                          int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const T state = cpu::geluTanh(gate[c]) * up[c];
    hidden[c] = state;
    weighted[c] = weight * state;
  }
}

// With dState = weight · dHidden: dGate = dState · up · gelu_tanh'(gate), dUp = dState · gelu_tanh(gate).
template <typename T>
[[gnu::always_inline]] inline void gatedGeluBackwardRowIn(const T* gate, const T* up, const T* dHidden, T weight,
                                                          T* dGate, T* dUp, int64_t n) {
  for (int64_t c = 0; c < n; ++c) {
    const T dState = weight * dHidden[c];
    dGate[c] = dState * up[c] * geluTanhDerivative(gate[c]);
    dUp[c] = dState * cpu::geluTanh(gate[c]);
  }
}

// The f32 instances, compiled in AVX2 clones (ExpertMath.cpp).
void gatedGeluRowF32(float* row, int64_t n);
void gatedGeluWeightedRowF32(const float* gate, const float* up, float weight, float* hidden, float* weighted, int64_t n);
void gatedGeluBackwardRowF32(const float* gate, const float* up, const float* dHidden, float weight, float* dGate,
                             float* dUp, int64_t n);

template <typename T>
inline void gatedGeluRow(T* row, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    gatedGeluRowF32(row, n);
  else
    gatedGeluRowIn(row, n);
}
template <typename T>
inline void gatedGeluWeightedRow(const T* gate, const T* up, T weight, T* hidden, T* weighted, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    gatedGeluWeightedRowF32(gate, up, weight, hidden, weighted, n);
  else
    gatedGeluWeightedRowIn(gate, up, weight, hidden, weighted, n);
}
template <typename T>
inline void gatedGeluBackwardRow(const T* gate, const T* up, const T* dHidden, T weight, T* dGate, T* dUp, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    gatedGeluBackwardRowF32(gate, up, dHidden, weight, dGate, dUp, n);
  else
    gatedGeluBackwardRowIn(gate, up, dHidden, weight, dGate, dUp, n);
}

}  // namespace dgemma::expert_math
