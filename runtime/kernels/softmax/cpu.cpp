// softmax along one axis, max-subtracted so that exp never overflows.
#include <cmath>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

// The tensor seen as [outer, length, inner] around the axis: a "line" is one (outer, inner) pair,
// its `length` elements `inner` apart. For the last axis inner is 1 and lines are contiguous rows.
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

std::unique_ptr<Kernel> createSoftmax(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  cpu::expectFloat(signature, x, "input x");
  expectDType(signature, y, {x.dtype}, "output y");
  cpu::expectShape(signature, y, x.shape, "output y");
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t requestedAxis = attrInt(signature, "axis");
  const int64_t axis = requestedAxis < 0 ? requestedAxis + rank : requestedAxis;
  if (axis < 0 || axis >= rank)
    failSignature(signature, "attribute 'axis': " + std::to_string(requestedAxis) + " is out of range for input x " +
                                 shapeToString(x.shape));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape[d];
  const int64_t length = x.shape[axis];
  if (x.dtype == DType::F64) return std::make_unique<SoftmaxKernel<double>>(outer, length, inner);
  return std::make_unique<SoftmaxKernel<float>>(outer, length, inner);
}

}  // namespace

void registerSoftmaxCpuKernels(KernelRegistry& registry) { registry.add("softmax", createSoftmax); }

}  // namespace dgemma
