#include "runtime/kernels/rms_norm/Contract.h"

#include <string>
#include <utility>

namespace dgemma {
namespace {

// The `eps` attribute both kernels take.
double parseEps(const KernelSignature& signature) {
  const double eps = attrDouble(signature, "eps");
  if (!(eps >= 0.0))
    failSignature(signature, "attribute 'eps': expected a non-negative number, got " + std::to_string(eps));
  return eps;
}

void expectNotScalar(const KernelSignature& signature, const Buffer& x) {
  if (x.shape.empty()) failSignature(signature, "input x is a scalar, expected rank >= 1");
}

// The geometry of x once its buffers are checked.
RmsNormContract contractFor(const KernelSignature& signature, const Buffer& x, bool weighted) {
  RmsNormContract contract;
  contract.dtype = x.dtype;
  contract.width = x.shape.back();
  contract.rows = contract.width == 0 ? 0 : x.numElements() / contract.width;
  contract.eps = parseEps(signature);
  contract.weighted = weighted;
  return contract;
}

}  // namespace

RmsNormContract parseRmsNormContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArityRange(signature, 1, 2, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, x, dtypes, "input x");
  expectDType(signature, y, {x.dtype}, "output y");
  expectShape(signature, y, x.shape, "output y");
  expectNotScalar(signature, x);
  const bool weighted = signature.inputs.size() == 2;
  if (weighted) {
    const Buffer& weight = *signature.inputs[1];
    expectDType(signature, weight, {x.dtype}, "input w");
    expectShape(signature, weight, {x.shape.back()}, "input w");
  }
  return contractFor(signature, x, weighted);
}

RmsNormContract parseRmsNormBackwardContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const bool weighted = signature.inputs.size() == 3;
  expectArity(signature, weighted ? 3 : 2, weighted ? 2 : 1);
  const Buffer& x = *signature.inputs[0];
  expectDType(signature, x, dtypes, "input x");
  expectNotScalar(signature, x);
  for (const auto& [buffer, role] : {std::pair{signature.inputs[1], "input dy"}, std::pair{signature.outputs[0], "output dx"}}) {
    expectDType(signature, *buffer, {x.dtype}, role);
    expectShape(signature, *buffer, x.shape, role);
  }
  if (weighted)
    for (const auto& [buffer, role] : {std::pair{signature.inputs[2], "input w"}, std::pair{signature.outputs[1], "output dw"}}) {
      expectDType(signature, *buffer, {x.dtype}, role);
      expectShape(signature, *buffer, {x.shape.back()}, role);
    }
  return contractFor(signature, x, weighted);
}

}  // namespace dgemma
