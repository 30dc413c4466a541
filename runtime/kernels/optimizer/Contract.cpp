#include "runtime/kernels/optimizer/Contract.h"

#include <string>

namespace dgemma {

AdamwContract parseAdamwContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 8, 3);
  const Buffer& param = *signature.inputs[0];
  expectDType(signature, param, dtypes, "input param");
  static const char* const kTensorRoles[] = {"input param", "input grad", "input exp_avg", "input exp_avg_sq"};
  for (size_t i = 1; i < 4; ++i) {
    expectDType(signature, *signature.inputs[i], {param.dtype}, kTensorRoles[i]);
    expectShape(signature, *signature.inputs[i], param.shape, kTensorRoles[i]);
  }
  static const char* const kScalarRoles[] = {"input grad_scale", "input lr", "input bias_correction1",
                                             "input bias_correction2"};
  for (size_t i = 4; i < 8; ++i) {
    expectDType(signature, *signature.inputs[i], {param.dtype}, kScalarRoles[i - 4]);
    expectShape(signature, *signature.inputs[i], {}, kScalarRoles[i - 4]);
  }
  for (size_t i = 0; i < 3; ++i) {
    const std::string role = "output " + std::to_string(i);
    expectDType(signature, *signature.outputs[i], {param.dtype}, role);
    expectShape(signature, *signature.outputs[i], param.shape, role);
  }
  AdamwContract contract;
  contract.dtype = param.dtype;
  contract.count = param.numElements();
  contract.beta1 = attrDouble(signature, "beta1");
  contract.beta2 = attrDouble(signature, "beta2");
  contract.epsilon = attrDouble(signature, "epsilon");
  contract.weightDecay = attrDouble(signature, "weight_decay");
  return contract;
}

}  // namespace dgemma
