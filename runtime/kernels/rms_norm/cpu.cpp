// rms_norm over the last dimension: y = x * (mean(x^2) + eps)^(-1/2), then * w when w is given.
#include <cmath>

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
  const double eps = attrDouble(signature, "eps");
  if (!(eps >= 0.0))
    failSignature(signature, "attribute 'eps': expected a non-negative number, got " + std::to_string(eps));
  const int64_t rows = width == 0 ? 0 : x.numElements() / width;
  if (x.dtype == DType::F64) return std::make_unique<RmsNormKernel<double>>(rows, width, eps);
  return std::make_unique<RmsNormKernel<float>>(rows, width, eps);
}

}  // namespace

void registerRmsNormCpuKernels(KernelRegistry& registry) { registry.add("rms_norm", createRmsNorm); }

}  // namespace dgemma
