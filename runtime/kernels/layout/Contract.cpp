#include "runtime/kernels/layout/Contract.h"

#include <string>

#include "support/Shape.h"

namespace dgemma {

TransposeContract parseTransposeContract(const KernelSignature& signature) {
  const auto [x, y] = expectUnaryOperands(signature, OutputShape::Free);
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

  TransposeContract contract;
  contract.elementBytes = dtypeSize(x.dtype);
  contract.inputShape = x.shape;
  contract.perm = perm;
  contract.outputShape.resize(rank);
  for (size_t k = 0; k < rank; ++k) contract.outputShape[k] = x.shape[perm[k]];
  expectShape(signature, y, contract.outputShape, "output y");
  contract.count = x.numElements();
  return contract;
}

ReshapeContract parseReshapeContract(const KernelSignature& signature) {
  const auto [x, y] = expectUnaryOperands(signature, OutputShape::Free);
  if (x.numElements() != y.numElements())
    failSignature(signature, "output y " + shapeToString(y.shape) + " and input x " + shapeToString(x.shape) +
                                 " differ in element count");
  return ReshapeContract{x.bytes()};
}

ConcatContract parseConcatContract(const KernelSignature& signature) {
  if (signature.inputs.empty() || signature.outputs.size() != 1)
    failSignature(signature, "expected at least 1 input and 1 output, got " + std::to_string(signature.inputs.size()) +
                                 " and " + std::to_string(signature.outputs.size()));
  const Buffer& y = *signature.outputs[0];
  const int64_t rank = static_cast<int64_t>(y.shape.size());
  const int64_t dim = attrInt(signature, "dim");
  if (dim < 0 || dim >= rank)
    failSignature(signature, "attribute 'dim': " + std::to_string(dim) + " is outside the output's rank " + std::to_string(rank));
  // y's shape outside `dim` (every input is checked to agree with it there), the inputs' sum along it.
  std::vector<int64_t> expected = y.shape;
  expected[dim] = 0;
  ConcatContract contract;
  for (size_t i = 0; i < signature.inputs.size(); ++i) {
    const Buffer& x = *signature.inputs[i];
    expectDType(signature, x, {y.dtype}, "input " + std::to_string(i));
    std::vector<int64_t> withoutDim = x.shape, reference = y.shape;
    if (static_cast<int64_t>(x.shape.size()) != rank)
      failSignature(signature, "input " + std::to_string(i) + " has rank " + std::to_string(x.shape.size()) + ", output " +
                                   std::to_string(rank));
    withoutDim[dim] = reference[dim] = 0;
    if (withoutDim != reference)
      failSignature(signature, "input " + std::to_string(i) + " " + shapeToString(x.shape) + " differs from output " +
                                   shapeToString(y.shape) + " outside dim " + std::to_string(dim));
    expected[dim] += x.shape[dim];
    int64_t inner = 1;
    for (int64_t d = dim; d < rank; ++d) inner *= x.shape[d];
    contract.blockBytes.push_back(static_cast<uint64_t>(inner) * dtypeSize(x.dtype));
  }
  expectShape(signature, y, expected, "output y");
  for (int64_t d = 0; d < dim; ++d) contract.outerCount *= y.shape[d];
  return contract;
}

SliceContract parseSliceContract(const KernelSignature& signature) {
  const auto [x, y] = expectUnaryOperands(signature, OutputShape::Free);
  const int64_t rank = static_cast<int64_t>(x.shape.size());
  const int64_t dim = attrInt(signature, "dim"), start = attrInt(signature, "start");
  if (dim < 0 || dim >= rank || static_cast<int64_t>(y.shape.size()) != rank)
    failSignature(signature, "attribute 'dim': " + std::to_string(dim) + " is not a dimension of input x " + shapeToString(x.shape) +
                                 " and output y " + shapeToString(y.shape));
  std::vector<int64_t> expected = x.shape;
  expected[dim] = y.shape[dim];
  expectShape(signature, y, expected, "output y");
  if (start < 0 || start + y.shape[dim] > x.shape[dim])
    failSignature(signature, "attribute 'start': block [" + std::to_string(start) + ", " + std::to_string(start + y.shape[dim]) +
                                 ") leaves dim " + std::to_string(dim) + " of size " + std::to_string(x.shape[dim]));
  int64_t inner = 1;
  SliceContract contract;
  for (int64_t d = 0; d < dim; ++d) contract.outerCount *= x.shape[d];
  for (int64_t d = dim + 1; d < rank; ++d) inner *= x.shape[d];
  const uint64_t element = dtypeSize(x.dtype);
  contract.inputRowBytes = x.shape[dim] * inner * element;
  contract.offsetBytes = start * inner * element;
  contract.outputRowBytes = y.shape[dim] * inner * element;
  return contract;
}

}  // namespace dgemma
