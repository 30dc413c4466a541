#include "runtime/kernels/reduce/Contract.h"

#include <string>

#include "support/Shape.h"

namespace dgemma {

ReduceContract parseReduceContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const auto [x, y] = expectUnaryOperands(signature, dtypes, OutputShape::Free);
  const std::vector<int64_t> dims = attrInts(signature, "dims");
  const bool keepDims = attrBool(signature, "keep_dims");

  const int64_t rank = static_cast<int64_t>(x.shape.size());
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] < 0 || dims[i] >= rank || (i > 0 && dims[i] <= dims[i - 1]))
      failSignature(signature, "attribute 'dims': expected distinct dimensions of input x " + shapeToString(x.shape) +
                                   " in increasing order, got " + shapeToString(dims));

  ReduceContract contract;
  contract.dtype = x.dtype;
  std::vector<int64_t> expected;
  size_t nextReduced = 0;
  for (int64_t d = 0; d < rank; ++d) {
    if (nextReduced < dims.size() && dims[nextReduced] == d) {
      ++nextReduced;
      contract.reducedDims.push_back(d);
      if (keepDims) expected.push_back(1);
    } else {
      contract.keptDims.push_back(d);
      expected.push_back(x.shape[d]);
    }
  }
  expectShape(signature, y, expected, "output y");
  return contract;
}

}  // namespace dgemma
