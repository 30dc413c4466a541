#include "runtime/kernels/matmul/Contract.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "support/Shape.h"

namespace dgemma {

MatmulContract parseMatmulContract(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                   bool f32OutputOfBf16) {
  const bool f32Output = f32OutputOfBf16 && !signature.inputs.empty() && signature.inputs[0]->dtype == DType::BF16 &&
                         !signature.outputs.empty() && signature.outputs[0]->dtype == DType::F32;
  const auto [a, b, c] =
      expectBinaryOperands(signature, dtypes, f32Output ? std::optional<DType>(DType::F32) : std::nullopt);
  MatmulContract contract;
  contract.dtype = a.dtype;
  contract.outputDType = c.dtype;
  contract.transposeA = attrBool(signature, "transpose_a");
  contract.transposeB = attrBool(signature, "transpose_b");

  const size_t rank = a.shape.size();
  if (rank < 2) failSignature(signature, "input a has shape " + shapeToString(a.shape) + ", expected rank >= 2");
  const std::vector<int64_t> batchDims(a.shape.begin(), a.shape.end() - 2);
  contract.batch = numElementsOf(batchDims);
  contract.m = contract.transposeA ? a.shape[rank - 1] : a.shape[rank - 2];
  contract.k = contract.transposeA ? a.shape[rank - 2] : a.shape[rank - 1];

  contract.sharedB = b.shape.size() == 2;
  const bool batchedB = b.shape.size() == rank && std::equal(batchDims.begin(), batchDims.end(), b.shape.begin());
  if (!contract.sharedB && !batchedB)
    failSignature(signature, "input b has shape " + shapeToString(b.shape) + ", expected rank 2 or a's batch dims " +
                                 shapeToString(batchDims) + " followed by two dims");
  const size_t rankB = b.shape.size();
  const int64_t contractionB = contract.transposeB ? b.shape[rankB - 1] : b.shape[rankB - 2];
  contract.n = contract.transposeB ? b.shape[rankB - 2] : b.shape[rankB - 1];
  if (contractionB != contract.k)
    failSignature(signature, "contraction mismatch: a " + shapeToString(a.shape) + " has K=" +
                                 std::to_string(contract.k) + ", b " + shapeToString(b.shape) + " has K=" +
                                 std::to_string(contractionB));

  std::vector<int64_t> expected = batchDims;
  expected.push_back(contract.m);
  expected.push_back(contract.n);
  expectShape(signature, c, expected, "output c");
  return contract;
}

}  // namespace dgemma
