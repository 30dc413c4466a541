// rms_norm over the last dimension: y = x * (mean(x^2) + eps)^(-1/2), then * w when w is given;
// and rms_norm_backward, its gradients in one pass per row.
//
// The backward's f32 row loops run in AVX2 clones without FMA (FastMath.h): eight lanes where the
// baseline has four, each operation rounded as written, so the results are the same bits on every
// x86-64 CPU.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/rms_norm/Contract.h"

namespace dgemma {
namespace {

// T is also the accumulator type: f32 rows sum in f32 and f64 rows in f64, as the contract says, so
// that the CPU and GPU backends agree on f32 and f64 stays exact enough for finite differences.
template <typename T>
class RmsNormKernel final : public Kernel {
 public:
  RmsNormKernel(int64_t rows, int64_t width, double eps) : rows_(rows), width_(width), eps_(static_cast<T>(eps)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    const T* weight = inputs.size() > 1 ? inputs[1].as<const T>() : nullptr;
    T* y = outputs[0].as<T>();
    const int64_t width = width_;
    cpu::parallelFor(context, rows_, cpu::rowGrain(width), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const T* xRow = x + row * width;
        T* yRow = y + row * width;
        const T sumOfSquares = cpu::dotProduct(xRow, xRow, width);
        const T scale = T(1) / std::sqrt(sumOfSquares / static_cast<T>(width) + eps_);
        if (weight != nullptr) {
          for (int64_t i = 0; i < width; ++i) yRow[i] = xRow[i] * scale * weight[i];
        } else {
          for (int64_t i = 0; i < width; ++i) yRow[i] = xRow[i] * scale;
        }
      }
    });
  }

 private:
  int64_t rows_;
  int64_t width_;
  T eps_;
};

// The backward's row sums Σx² and Σ(g x) in f64, each in kRowLanes partial sums: lane l takes the
// columns c ≡ l (mod kRowLanes) in order, then the lanes are added in lane order. The order depends
// on the width only, so neither the thread count nor the CPU changes a bit of the result.
constexpr int64_t kRowLanes = 8;

struct RowSums {
  double sumOfSquares = 0;
  double projection = 0;
};

// g_i = dy_i · w_i (or dy_i) in f64.
template <typename T>
[[gnu::always_inline]] inline double gradientAt(const T* dy, const T* weight, int64_t i) {
  return weight != nullptr ? static_cast<double>(dy[i]) * static_cast<double>(weight[i]) : static_cast<double>(dy[i]);
}

// Four f64 lanes as a GCC vector, written out so that the lanes stay in registers (the compiler's
// own vectorising of a lane array converted and spilled element by element).
using Doubles4 = double __attribute__((vector_size(32)));

// p[0..4) widened to f64 (the result by reference: a by-value AVX vector would change the
// baseline clone's ABI).
template <typename T>
[[gnu::always_inline]] inline void loadDoubles4(const T* p, Doubles4& lanes) {
  T values[4];
  std::memcpy(values, p, sizeof values);
  lanes = Doubles4{static_cast<double>(values[0]), static_cast<double>(values[1]), static_cast<double>(values[2]),
                   static_cast<double>(values[3])};
}

template <typename T>
[[gnu::always_inline]] inline RowSums rowSumsIn(const T* x, const T* dy, const T* weight, int64_t width) {
  static_assert(kRowLanes == 8, "two vectors of four lanes");
  Doubles4 squaresLow = {}, squaresHigh = {}, projectionsLow = {}, projectionsHigh = {};
  Doubles4 xLow, xHigh, gLow, gHigh, wLow, wHigh;
  int64_t i = 0;
  for (; i + kRowLanes <= width; i += kRowLanes) {
    loadDoubles4(x + i, xLow);
    loadDoubles4(x + i + 4, xHigh);
    loadDoubles4(dy + i, gLow);
    loadDoubles4(dy + i + 4, gHigh);
    if (weight != nullptr) {
      loadDoubles4(weight + i, wLow);
      loadDoubles4(weight + i + 4, wHigh);
      gLow *= wLow;
      gHigh *= wHigh;
    }
    squaresLow += xLow * xLow;
    squaresHigh += xHigh * xHigh;
    projectionsLow += gLow * xLow;
    projectionsHigh += gHigh * xHigh;
  }
  double squares[kRowLanes], projections[kRowLanes];
  for (int64_t lane = 0; lane < 4; ++lane) {
    squares[lane] = squaresLow[lane];
    squares[lane + 4] = squaresHigh[lane];
    projections[lane] = projectionsLow[lane];
    projections[lane + 4] = projectionsHigh[lane];
  }
  for (int64_t lane = 0; i < width; ++i, ++lane) {
    const double xValue = static_cast<double>(x[i]);
    squares[lane] += xValue * xValue;
    projections[lane] += gradientAt(dy, weight, i) * xValue;
  }
  RowSums sums;
  for (int64_t lane = 0; lane < kRowLanes; ++lane) {
    sums.sumOfSquares += squares[lane];
    sums.projection += projections[lane];
  }
  return sums;
}

// dx_i = r g_i − correction · x_i, rounded once to T.
template <typename T>
[[gnu::always_inline]] inline void inputGradientRowIn(const T* x, const T* dy, const T* weight, T* dx, int64_t width,
                                                       double r, double correction) {
  for (int64_t i = 0; i < width; ++i)
    dx[i] = static_cast<T>(r * gradientAt(dy, weight, i) - correction * static_cast<double>(x[i]));
}

// Adds dy_j x_j r of one row to the f64 column sums of [first, last).
template <typename T>
[[gnu::always_inline]] inline void addWeightGradientRowIn(const T* x, const T* dy, double r, int64_t first, int64_t last,
                                                          double* sums) {
  for (int64_t j = first; j < last; ++j)
    sums[j - first] += static_cast<double>(dy[j]) * static_cast<double>(x[j]) * r;
}

DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA RowSums rowSumsF32(const float* x, const float* dy, const float* weight,
                                                         int64_t width) {
  return rowSumsIn(x, dy, weight, width);
}
DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA void inputGradientRowF32(const float* x, const float* dy, const float* weight,
                                                               float* dx, int64_t width, double r, double correction) {
  inputGradientRowIn(x, dy, weight, dx, width, r, correction);
}
DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA void addWeightGradientRowF32(const float* x, const float* dy, double r,
                                                                   int64_t first, int64_t last, double* sums) {
  addWeightGradientRowIn(x, dy, r, first, last, sums);
}

template <typename T>
RowSums rowSums(const T* x, const T* dy, const T* weight, int64_t width) {
  if constexpr (std::is_same_v<T, float>)
    return rowSumsF32(x, dy, weight, width);
  else
    return rowSumsIn(x, dy, weight, width);
}

template <typename T>
void inputGradientRow(const T* x, const T* dy, const T* weight, T* dx, int64_t width, double r, double correction) {
  if constexpr (std::is_same_v<T, float>)
    inputGradientRowF32(x, dy, weight, dx, width, r, correction);
  else
    inputGradientRowIn(x, dy, weight, dx, width, r, correction);
}

template <typename T>
void addWeightGradientRow(const T* x, const T* dy, double r, int64_t first, int64_t last, double* sums) {
  if constexpr (std::is_same_v<T, float>)
    addWeightGradientRowF32(x, dy, r, first, last, sums);
  else
    addWeightGradientRowIn(x, dy, r, first, last, sums);
}

// With r = (mean(x²) + eps)^(-1/2) and g = dy·w: dx = r g − x r³ Σ(g x) / H per row, and
// dw_j = Σ_rows dy_j x_j r. The row sums (in lanes, see kRowLanes) and dw accumulate in double (H
// reaches 2816, and dw sums over every token of the micro-batch); each row's r is kept for dw. dw
// sums the rows in order for each column block, so it does not depend on the thread count.
template <typename T>
class RmsNormBackwardKernel final : public Kernel {
 public:
  RmsNormBackwardKernel(int64_t rows, int64_t width, double eps, bool weighted)
      : rows_(rows), width_(width), eps_(eps), weighted_(weighted), rowScales_(static_cast<size_t>(rows)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    const T* dy = inputs[1].as<const T>();
    const T* weight = weighted_ ? inputs[2].as<const T>() : nullptr;
    T* dx = outputs[0].as<T>();
    const int64_t width = width_;
    cpu::parallelFor(context, rows_, cpu::rowGrain(width), [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const T* xRow = x + row * width;
        const T* dyRow = dy + row * width;
        T* dxRow = dx + row * width;
        const RowSums sums = rowSums(xRow, dyRow, weight, width);
        const double r = 1.0 / std::sqrt(sums.sumOfSquares / static_cast<double>(width) + eps_);
        const double correction = r * r * r * sums.projection / static_cast<double>(width);
        inputGradientRow(xRow, dyRow, weight, dxRow, width, r, correction);
        rowScales_[row] = r;
      }
    });
    if (!weighted_) return;
    T* dw = outputs[1].as<T>();
    // Blocks of 128 columns: each row's slice is a long vector loop, and its f64 sums (1 KiB) stay
    // in L1. Every column sums its rows in order, whichever thread runs its block.
    constexpr int64_t kColumns = 128;
    cpu::parallelFor(context, (width + kColumns - 1) / kColumns, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const int64_t first = block * kColumns, last = std::min(width, first + kColumns);
        double sums[kColumns] = {};
        for (int64_t row = 0; row < rows_; ++row)
          addWeightGradientRow(x + row * width, dy + row * width, rowScales_[row], first, last, sums);
        for (int64_t j = first; j < last; ++j) dw[j] = static_cast<T>(sums[j - first]);
      }
    });
  }

 private:
  int64_t rows_;
  int64_t width_;
  double eps_;
  bool weighted_;
  std::vector<double> rowScales_;
};

std::unique_ptr<Kernel> createRmsNormKernel(const KernelSignature& signature) {
  const RmsNormContract c = parseRmsNormContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<RmsNormKernel<double>>(c.rows, c.width, c.eps);
  return std::make_unique<RmsNormKernel<float>>(c.rows, c.width, c.eps);
}

std::unique_ptr<Kernel> createRmsNormBackwardKernel(const KernelSignature& signature) {
  const RmsNormContract c = parseRmsNormBackwardContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<RmsNormBackwardKernel<double>>(c.rows, c.width, c.eps, c.weighted);
  return std::make_unique<RmsNormBackwardKernel<float>>(c.rows, c.width, c.eps, c.weighted);
}

}  // namespace

void registerRmsNormCpuKernels(KernelRegistry& registry) {
  registry.add("rms_norm", createRmsNormKernel);
  registry.add("rms_norm_backward", createRmsNormBackwardKernel);
}

}  // namespace dgemma
