#include "runtime/kernels/rope/Contract.h"

#include <cmath>
#include <string>

namespace dgemma {

RopeContract parseRopeContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 2, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& positions = *signature.inputs[1];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, x, dtypes, "input x");
  expectDType(signature, positions, {DType::I64}, "input positions");
  expectDType(signature, y, {x.dtype}, "output y");
  expectRank(signature, x, 4, "input x", "[B, T, H, D]");
  expectShape(signature, positions, {x.shape[0], x.shape[1]}, "input positions");
  expectShape(signature, y, x.shape, "output y");
  RopeContract contract;
  contract.dtype = x.dtype;
  contract.positions = x.shape[0] * x.shape[1];
  contract.heads = x.shape[2];
  contract.headDim = x.shape[3];
  if (contract.headDim % 2 != 0)
    failSignature(signature, "input x has head dim D=" + std::to_string(contract.headDim) +
                                 "; the rotate-half layout needs an even D");

  contract.theta = attrDouble(signature, "theta");
  if (!(contract.theta > 0.0) || !std::isfinite(contract.theta))
    failSignature(signature,
                  "attribute 'theta': expected a positive finite number, got " + std::to_string(contract.theta));
  contract.rotatedPairs = attrInt(signature, "rotated_pairs");
  if (contract.rotatedPairs < 1 || contract.rotatedPairs > contract.headDim / 2)
    failSignature(signature, "attribute 'rotated_pairs': " + std::to_string(contract.rotatedPairs) +
                                 " is outside [1, D/2 = " + std::to_string(contract.headDim / 2) + "]");
  contract.frequencyDim = attrInt(signature, "frequency_dim");
  if (contract.frequencyDim < 1)
    failSignature(signature, "attribute 'frequency_dim': expected a positive integer, got " +
                                 std::to_string(contract.frequencyDim));
  contract.inverse = attrBool(signature, "inverse");
  return contract;
}

}  // namespace dgemma
