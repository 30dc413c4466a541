#include "runtime/kernels/softmax/Contract.h"

#include <string>

#include "support/Shape.h"

namespace dgemma {

SoftmaxContract parseSoftmaxContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const Buffer& x = expectUnaryOperands(signature, dtypes, OutputShape::SameAsInput).x;
  SoftmaxContract contract;
  contract.dtype = x.dtype;
  contract.rank = static_cast<int64_t>(x.shape.size());
  contract.requestedAxis = attrInt(signature, "axis");
  contract.axis = contract.requestedAxis < 0 ? contract.requestedAxis + contract.rank : contract.requestedAxis;
  if (contract.axis < 0 || contract.axis >= contract.rank)
    failSignature(signature, "attribute 'axis': " + std::to_string(contract.requestedAxis) +
                                 " is out of range for input x " + shapeToString(x.shape));
  for (int64_t d = 0; d < contract.axis; ++d) contract.outer *= x.shape[d];
  for (int64_t d = contract.axis + 1; d < contract.rank; ++d) contract.inner *= x.shape[d];
  contract.length = x.shape[contract.axis];
  return contract;
}

}  // namespace dgemma
