// The per-row and per-column arithmetic of rms_norm_backward (docs/kernels.md) as the CUDA kernel
// runs it (rms_norm/cuda.cu): with r = (mean(x²) + eps)^(-1/2) and g = dy · w (or dy),
//   dx = r g − x r³ Σ(g x) / H,   dw_j = Σ_rows dy_j x_j r,
// the row sums and dw in f64, rounded once. The CUDA kernel sums a row's terms as a tree over its
// threads and dw over the rows in order; the CPU unit test (RmsNormMathTest) runs these functions
// on the host against the CPU kernel. Plain C++ when not compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/kernels/HostDevice.h"
#include "runtime/kernels/KernelElements.h"

namespace dgemma::rms_norm {

// One column's terms of a row's two sums: x² and g·x.
struct RowTerms {
  double sumOfSquares = 0;
  double projection = 0;
};

template <typename T>
DGEMMA_HOST_DEVICE inline double gradientOf(const T* dy, const T* weight, int64_t index, int64_t column) {
  const double d = kernels::loadFloat(dy, index);
  return weight != nullptr ? d * static_cast<double>(kernels::loadFloat(weight, column)) : d;
}

// The row's scale r and the coefficient r³ Σ(g x) / H of x in dx, from the row's two sums.
struct RowScales {
  double r = 0;
  double correction = 0;
};

DGEMMA_HOST_DEVICE inline RowScales rowScales(double sumOfSquares, double projection, int64_t width, double eps) {
  RowScales scales;
  scales.r = 1.0 / sqrt(sumOfSquares / static_cast<double>(width) + eps);
  scales.correction = scales.r * scales.r * scales.r * projection / static_cast<double>(width);
  return scales;
}

// dx at (row, column): r g − correction x.
DGEMMA_HOST_DEVICE inline double inputGradient(const RowScales& scales, double g, double x) {
  return scales.r * g - scales.correction * x;
}

// dw_j = Σ_rows dy_j x_j r_row, rows in order from zero.
template <typename T>
DGEMMA_HOST_DEVICE inline double weightGradient(const T* x, const T* dy, const double* rowR, int64_t rows, int64_t width,
                                                int64_t column) {
  double sum = 0;
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t index = row * width + column;
    DGEMMA_CUDA_BOUNDS(index, rows * width);
    sum += static_cast<double>(kernels::loadFloat(dy, index)) * kernels::loadFloat(x, index) * rowR[row];
  }
  return sum;
}

}  // namespace dgemma::rms_norm
