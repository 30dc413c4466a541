// rms_norm over the last dimension: y = x * (mean(x^2) + eps)^(-1/2), then * w when w is given;
// and rms_norm_backward, its gradients in one pass per row.
#include <cmath>
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

// With r = (mean(x²) + eps)^(-1/2) and g = dy·w: dx = r g − x r³ Σ(g x) / H per row, and
// dw_j = Σ_rows dy_j x_j r. The row sums and dw accumulate in double (H reaches 2816, and dw sums
// over every token of the micro-batch); each row's r is kept for dw. dw sums the rows in order for
// each column block, so it does not depend on the thread count.
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
        double sumOfSquares = 0, projection = 0;
        for (int64_t i = 0; i < width; ++i) {
          const double g = weight ? double(dyRow[i]) * weight[i] : double(dyRow[i]);
          sumOfSquares += double(xRow[i]) * xRow[i];
          projection += g * xRow[i];
        }
        const double r = 1.0 / std::sqrt(sumOfSquares / static_cast<double>(width) + eps_);
        const double correction = r * r * r * projection / static_cast<double>(width);
        for (int64_t i = 0; i < width; ++i) {
          const double g = weight ? double(dyRow[i]) * weight[i] : double(dyRow[i]);
          dxRow[i] = static_cast<T>(r * g - correction * xRow[i]);
        }
        rowScales_[row] = r;
      }
    });
    if (!weighted_) return;
    T* dw = outputs[1].as<T>();
    constexpr int64_t kColumns = 16;
    cpu::parallelFor(context, (width + kColumns - 1) / kColumns, 1, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const int64_t first = block * kColumns, last = std::min(width, first + kColumns);
        double sums[kColumns] = {};
        for (int64_t row = 0; row < rows_; ++row) {
          const T* xRow = x + row * width;
          const T* dyRow = dy + row * width;
          const double r = rowScales_[row];
          for (int64_t j = first; j < last; ++j) sums[j - first] += double(dyRow[j]) * xRow[j] * r;
        }
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
