// transpose and reshape: data movement only, for any dtype.
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

// Walks y in order and reads x through permuted strides: writes stay sequential, reads jump.
// `Word` is an unsigned integer of the element's size; moving bits is all a transpose does.
template <typename Word>
class TransposeKernel final : public Kernel {
 public:
  explicit TransposeKernel(cpu::StridedCursor<1> cursor, int64_t count) : cursor_(std::move(cursor)), count_(count) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const Word* x = inputs[0].as<const Word>();
    Word* y = outputs[0].as<Word>();
    const int64_t stride = cursor_.innerStride(0);
    cpu::parallelFor(context, count_, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      cpu::StridedCursor<1> cursor = cursor_;
      cursor.forEachRun(begin, end, [&](int64_t index, const std::array<int64_t, 1>& offsets, int64_t length) {
        const Word* source = x + offsets[0];
        for (int64_t k = 0; k < length; ++k) y[index + k] = source[k * stride];
      });
    });
  }

 private:
  cpu::StridedCursor<1> cursor_;
  int64_t count_;
};

std::unique_ptr<Kernel> createTranspose(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, y, {x.dtype}, "output y");
  const std::vector<int64_t> perm = attrInts(signature, "perm");
  const size_t rank = x.shape.size();
  std::vector<bool> seen(rank, false);
  bool isPermutation = perm.size() == rank;
  for (int64_t axis : perm) {
    if (!isPermutation) break;
    isPermutation = axis >= 0 && axis < static_cast<int64_t>(rank) && !seen[axis];
    if (isPermutation) seen[axis] = true;
  }
  if (!isPermutation)
    failSignature(signature, "attribute 'perm': " + shapeToString(perm) + " is not a permutation of the " +
                                 std::to_string(rank) + " dims of input x");

  const std::vector<int64_t> xStrides = cpu::rowMajorStrides(x.shape);
  std::vector<int64_t> expected(rank), readStrides(rank);
  for (size_t k = 0; k < rank; ++k) {
    expected[k] = x.shape[perm[k]];
    readStrides[k] = xStrides[perm[k]];
  }
  cpu::expectShape(signature, y, expected, "output y");
  cpu::StridedCursor<1> cursor(expected, {readStrides});
  const int64_t count = x.numElements();
  switch (dtypeSize(x.dtype)) {
    case 1: return std::make_unique<TransposeKernel<uint8_t>>(std::move(cursor), count);
    case 2: return std::make_unique<TransposeKernel<uint16_t>>(std::move(cursor), count);
    case 4: return std::make_unique<TransposeKernel<uint32_t>>(std::move(cursor), count);
    default: return std::make_unique<TransposeKernel<uint64_t>>(std::move(cursor), count);
  }
}

class ReshapeKernel final : public Kernel {
 public:
  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cpu::copyBytes(context, outputs[0].data, inputs[0].data, inputs[0].buffer->bytes());
  }
};

std::unique_ptr<Kernel> createReshape(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, y, {x.dtype}, "output y");
  if (x.numElements() != y.numElements())
    failSignature(signature, "output y " + shapeToString(y.shape) + " and input x " + shapeToString(x.shape) +
                                 " differ in element count");
  return std::make_unique<ReshapeKernel>();
}

}  // namespace

void registerLayoutCpuKernels(KernelRegistry& registry) {
  registry.add("transpose", createTranspose);
  registry.add("reshape", createReshape);
}

}  // namespace dgemma
