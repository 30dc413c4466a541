#include "runtime/kernels/dequantize/Contract.h"

#include <string>
#include <vector>

namespace dgemma {

DequantizeContract parseDequantizeContract(const KernelSignature& signature) {
  expectArity(signature, 2, 1);
  const Buffer& codes = *signature.inputs[0];
  const Buffer& scales = *signature.inputs[1];
  const Buffer& y = *signature.outputs[0];
  const std::string formatText = attrString(signature, "format");
  const std::optional<quant::Format> format = quant::parseFormat(formatText);
  if (!format) failSignature(signature, "attribute 'format': expected \"int8\" or \"nf4\", got \"" + formatText + "\"");
  expectDType(signature, y, {DType::F32, DType::BF16, DType::F64}, "output y");
  // Both throw InputError naming the step when y's shape does not fit the format.
  const std::vector<int64_t> codesShape = quant::codesShape(*format, y.shape, signature.where + ": output y");
  const std::vector<int64_t> scalesShape = quant::scalesShape(*format, y.shape, signature.where + ": output y");
  expectDType(signature, codes, {quant::codesDType(*format)}, "input codes");
  expectShape(signature, codes, codesShape, "input codes");
  expectDType(signature, scales, {DType::F32}, "input scales");
  expectShape(signature, scales, scalesShape, "input scales");
  DequantizeContract contract;
  contract.format = *format;
  contract.outputDtype = y.dtype;
  contract.count = y.numElements();
  contract.width = y.shape.back();
  return contract;
}

}  // namespace dgemma
