#include "runtime/kernels/canvas_sample/Contract.h"

namespace dgemma {

CanvasSampleContract parseCanvasSampleContract(const KernelSignature& signature) {
  expectArity(signature, 3, 4);
  const Buffer& logits = *signature.inputs[0];
  expectDType(signature, logits, {DType::F32}, "input logits");
  expectRank(signature, logits, 3, "input logits", "[B, L, V]");
  CanvasSampleContract contract;
  contract.batch = logits.shape[0];
  contract.canvas = logits.shape[1];
  contract.vocab = logits.shape[2];
  if (contract.vocab < 1) failSignature(signature, "input logits has an empty vocabulary (V = 0)");
  const Buffer& temperature = *signature.inputs[1];
  expectDType(signature, temperature, {DType::F32}, "input temperature");
  expectShape(signature, temperature, {contract.batch}, "input temperature");
  const Buffer& key = *signature.inputs[2];
  expectDType(signature, key, {DType::I64}, "input key");
  expectShape(signature, key, {contract.batch, 2}, "input key");
  const char* idRoles[] = {"output sampled", "output argmax"};
  for (size_t i = 0; i < 2; ++i) {
    expectDType(signature, *signature.outputs[i], {DType::I64}, idRoles[i]);
    expectShape(signature, *signature.outputs[i], {contract.batch, contract.canvas}, idRoles[i]);
  }
  expectDType(signature, *signature.outputs[2], {DType::F32}, "output entropy");
  expectShape(signature, *signature.outputs[2], {contract.batch, contract.canvas}, "output entropy");
  const Buffer& scaled = *signature.outputs[3];
  expectDType(signature, scaled, {DType::F32, DType::BF16}, "output scaled");
  expectShape(signature, scaled, logits.shape, "output scaled");
  contract.scaledDType = scaled.dtype;
  const double softcap = attrDouble(signature, "softcap");
  if (!(softcap >= 0)) failSignature(signature, "attribute 'softcap': expected a number >= 0 (0: none)");
  contract.softcap = static_cast<float>(softcap);
  return contract;
}

}  // namespace dgemma
