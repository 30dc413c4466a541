#include "runtime/kernels/softmax/Contract.h"

#include <string>

#include "support/Shape.h"

namespace dgemma {

SoftmaxContract parseSoftmaxContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 1, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, x, dtypes, "input x");
  expectDType(signature, y, {x.dtype}, "output y");
  expectShape(signature, y, x.shape, "output y");
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
