// The element functions of the elementwise kernels, shared by the kernels of single ops
// (elementwise/cpu.cpp) and the fused chains (fused_elementwise/cpu.cpp), so that a fused chain
// computes each op with exactly the same arithmetic: the same code, and for exp, tanh and gelu_tanh
// on f32 the same compiled AVX2 clones (whose FMA contraction rounds differently from the baseline).
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/CpuKernelSupport.h"

namespace dgemma::cpu {

// Binary operations.
struct AddOp {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};
struct SubOp {
  template <typename T>
  T operator()(T a, T b) const { return a - b; }
};
struct MulOp {
  template <typename T>
  T operator()(T a, T b) const { return a * b; }
};
struct DivOp {
  template <typename T>
  T operator()(T a, T b) const { return a / b; }
};
// NaN wins, as in NumPy: a NaN in an activation must not be hidden by a clamp.
struct MaximumOp {
  template <typename T>
  T operator()(T a, T b) const { return (std::isnan(a) || a > b) ? a : b; }
};
struct MinimumOp {
  template <typename T>
  T operator()(T a, T b) const { return (std::isnan(a) || a < b) ? a : b; }
};

// Unary maps.
struct NegOp {
  template <typename T>
  T operator()(T x) const { return -x; }
};
struct ExpOp {
  template <typename T>
  T operator()(T x) const { return cpu::fastExp(x); }
};
struct LogOp {
  template <typename T>
  T operator()(T x) const { return std::log(x); }
};
struct TanhOp {
  template <typename T>
  T operator()(T x) const { return cpu::fastTanh(x); }
};
struct SqrtOp {
  template <typename T>
  T operator()(T x) const { return std::sqrt(x); }
};
struct RsqrtOp {
  template <typename T>
  T operator()(T x) const { return T(1) / std::sqrt(x); }
};
struct GeluTanhOp {
  template <typename T>
  T operator()(T x) const { return cpu::geluTanh(x); }
};

// y[i] = op(x[i]) over [begin, end).
template <typename T, typename Op>
void mapElements(const T* x, T* y, int64_t begin, int64_t end) {
  const Op op;
  for (int64_t i = begin; i < end; ++i) y[i] = op(x[i]);
}

// mapElements of ExpOp, TanhOp and GeluTanhOp on f32, compiled once (elementwise/cpu.cpp) with
// DGEMMA_CPU_CLONES_FOR_AVX2: every kernel that maps these over f32 calls them.
void mapExp(const float* x, float* y, int64_t begin, int64_t end);
void mapTanh(const float* x, float* y, int64_t begin, int64_t end);
void mapGeluTanh(const float* x, float* y, int64_t begin, int64_t end);

}  // namespace dgemma::cpu
