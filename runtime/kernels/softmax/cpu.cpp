// softmax along one axis, max-subtracted so that exp never overflows.
//
// A contiguous line (the last axis, inner = 1) runs as four loops: the max in lanes, the exps into
// y (which vectorises), their sum in index order, the division. The sum is one f32 running sum, in
// the order a single loop over the line adds, so the result does not depend on how the exps were
// computed; the exps themselves are the same IEEE operations in every lane (the clone has no FMA).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/softmax/Contract.h"

namespace dgemma {
namespace {

template <typename T>
[[gnu::always_inline]] inline void softmaxRowIn(const T* x, T* y, int64_t length) {
  const T maximum = cpu::laneMaximum(x, length);
  for (int64_t j = 0; j < length; ++j) y[j] = cpu::fastExp(x[j] - maximum);
  T sum = 0;
  for (int64_t j = 0; j < length; ++j) sum += y[j];
  for (int64_t j = 0; j < length; ++j) y[j] /= sum;
}

DGEMMA_CPU_CLONES_FOR_AVX2_WITHOUT_FMA void softmaxRowF32(const float* x, float* y, int64_t length) {
  softmaxRowIn(x, y, length);
}

template <typename T>
void softmaxRow(const T* x, T* y, int64_t length) {
  if constexpr (std::is_same_v<T, float>)
    softmaxRowF32(x, y, length);
  else
    softmaxRowIn(x, y, length);
}

// Lines as softmax/Contract.h describes them.
template <typename T>
class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(int64_t outer, int64_t length, int64_t inner) : outer_(outer), length_(length), inner_(inner) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    T* y = outputs[0].as<T>();
    const int64_t length = length_, inner = inner_;
    if (length == 0) return;
    cpu::parallelFor(context, outer_ * inner, cpu::rowGrain(length), [&](int64_t begin, int64_t end) {
      for (int64_t line = begin; line < end; ++line) {
        const int64_t start = (line / inner) * length * inner + line % inner;
        const T* xLine = x + start;
        T* yLine = y + start;
        if (inner == 1) {
          softmaxRow(xLine, yLine, length);
          continue;
        }
        T maximum = xLine[0];
        for (int64_t j = 1; j < length; ++j) maximum = std::max(maximum, xLine[j * inner]);
        T sum = 0;
        for (int64_t j = 0; j < length; ++j) {
          const T e = cpu::fastExp(xLine[j * inner] - maximum);
          yLine[j * inner] = e;
          sum += e;
        }
        for (int64_t j = 0; j < length; ++j) yLine[j * inner] /= sum;
      }
    });
  }

 private:
  int64_t outer_;
  int64_t length_;
  int64_t inner_;
};

std::unique_ptr<Kernel> createSoftmaxKernel(const KernelSignature& signature) {
  const SoftmaxContract c = parseSoftmaxContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64) return std::make_unique<SoftmaxKernel<double>>(c.outer, c.length, c.inner);
  return std::make_unique<SoftmaxKernel<float>>(c.outer, c.length, c.inner);
}

}  // namespace

void registerSoftmaxCpuKernels(KernelRegistry& registry) { registry.add("softmax", createSoftmaxKernel); }

}  // namespace dgemma
