// rms_norm over the last dimension: y = x * (mean(x^2) + eps)^(-1/2), then * w when w is given;
// and rms_norm_backward, its gradients in one pass per row.
#include <cmath>
#include <vector>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

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

// The `eps` attribute both kernels take.
double epsAttr(const KernelSignature& signature) {
  const double eps = attrDouble(signature, "eps");
  if (!(eps >= 0.0))
    failSignature(signature, "attribute 'eps': expected a non-negative number, got " + std::to_string(eps));
  return eps;
}

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

std::unique_ptr<Kernel> createRmsNormBackward(const KernelSignature& signature) {
  const bool weighted = signature.inputs.size() == 3;
  expectArity(signature, weighted ? 3 : 2, weighted ? 2 : 1);
  const Buffer& x = *signature.inputs[0];
  cpu::expectFloat(signature, x, "input x");
  if (x.shape.empty()) failSignature(signature, "input x is a scalar, expected rank >= 1");
  for (const auto& [buffer, role] : {std::pair{signature.inputs[1], "input dy"}, std::pair{signature.outputs[0], "output dx"}}) {
    expectDType(signature, *buffer, {x.dtype}, role);
    cpu::expectShape(signature, *buffer, x.shape, role);
  }
  const int64_t width = x.shape.back();
  if (weighted)
    for (const auto& [buffer, role] : {std::pair{signature.inputs[2], "input w"}, std::pair{signature.outputs[1], "output dw"}}) {
      expectDType(signature, *buffer, {x.dtype}, role);
      cpu::expectShape(signature, *buffer, {width}, role);
    }
  const double eps = epsAttr(signature);
  const int64_t rows = width == 0 ? 0 : x.numElements() / width;
  if (x.dtype == DType::F64) return std::make_unique<RmsNormBackwardKernel<double>>(rows, width, eps, weighted);
  return std::make_unique<RmsNormBackwardKernel<float>>(rows, width, eps, weighted);
}

std::unique_ptr<Kernel> createRmsNorm(const KernelSignature& signature) {
  expectArityRange(signature, 1, 2, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  cpu::expectFloat(signature, x, "input x");
  expectDType(signature, y, {x.dtype}, "output y");
  cpu::expectShape(signature, y, x.shape, "output y");
  if (x.shape.empty()) failSignature(signature, "input x is a scalar, expected rank >= 1");
  const int64_t width = x.shape.back();
  if (signature.inputs.size() == 2) {
    const Buffer& weight = *signature.inputs[1];
    expectDType(signature, weight, {x.dtype}, "input w");
    cpu::expectShape(signature, weight, {width}, "input w");
  }
  const double eps = epsAttr(signature);
  const int64_t rows = width == 0 ? 0 : x.numElements() / width;
  if (x.dtype == DType::F64) return std::make_unique<RmsNormKernel<double>>(rows, width, eps);
  return std::make_unique<RmsNormKernel<float>>(rows, width, eps);
}

}  // namespace

void registerRmsNormCpuKernels(KernelRegistry& registry) {
  registry.add("rms_norm", createRmsNorm);
  registry.add("rms_norm_backward", createRmsNormBackward);
}

}  // namespace dgemma
