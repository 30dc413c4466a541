#include "runtime/kernels/fused_elementwise/Contract.h"

#include <algorithm>
#include <string>

#include "support/Shape.h"

namespace dgemma {

FusedElementwiseContract parseFusedElementwiseContract(const KernelSignature& signature,
                                                       std::initializer_list<DType> dtypes) {
  if (signature.inputs.empty()) failSignature(signature, "expected at least one input");
  expectArity(signature, signature.inputs.size(), 1);
  const Buffer& y = *signature.outputs[0];
  FusedElementwiseContract contract;
  contract.shape = y.shape;
  std::string error;
  const std::string text = attrString(signature, "program");
  std::optional<fused::Program> program =
      fused::parseProgram(text, static_cast<int64_t>(signature.inputs.size()), error);
  if (!program) failSignature(signature, "attribute 'program': " + error);
  contract.program = std::move(*program);

  std::vector<std::string> inputDTypes;
  for (size_t index = 0; index < signature.inputs.size(); ++index) {
    const Buffer& input = *signature.inputs[index];
    const std::string role = "input " + std::to_string(index);
    // Aligned on the right, each dimension equal to y's or 1.
    bool broadcasts = input.shape.size() <= y.shape.size();
    for (size_t d = 0; broadcasts && d < input.shape.size(); ++d) {
      const int64_t own = input.shape[input.shape.size() - 1 - d], target = y.shape[y.shape.size() - 1 - d];
      broadcasts = own == target || own == 1;
    }
    if (!broadcasts)
      failSignature(signature, role + " " + shapeToString(input.shape) + " does not broadcast to output y " +
                                   shapeToString(y.shape));
    if (input.dtype != DType::Bool) expectDType(signature, input, dtypes, role);
    inputDTypes.emplace_back(dtypeName(input.dtype));
  }
  const auto names = fused::valueDTypes(contract.program, inputDTypes, error);
  if (!names) failSignature(signature, "attribute 'program': " + error);
  for (const std::string& name : *names) {
    const std::optional<DType> dtype = parseDType(name);
    contract.valueDTypes.push_back(*dtype);  // valueDTypes admits only dtype names
    if (*dtype == DType::F64) contract.computesInF64 = true;
  }
  for (size_t value = signature.inputs.size(); value < contract.valueDTypes.size(); ++value)
    if (std::find(dtypes.begin(), dtypes.end(), contract.valueDTypes[value]) == dtypes.end())
      failSignature(signature, "attribute 'program': value " + std::to_string(value) + " has dtype " +
                                   std::string(dtypeName(contract.valueDTypes[value])) + ", which this backend does not implement");
  expectDType(signature, y, {contract.valueDTypes.back()}, "output y");
  return contract;
}

}  // namespace dgemma
