#include "runtime/kernels/gather/Contract.h"

#include <string>
#include <vector>

#include "support/Shape.h"

namespace dgemma {

GatherContract parseGatherContract(const KernelSignature& signature) {
  expectArity(signature, 2, 1);
  const Buffer& table = *signature.inputs[0];
  const Buffer& ids = *signature.inputs[1];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, ids, {DType::I32, DType::I64}, "input ids");
  expectDType(signature, y, {table.dtype}, "output y");
  if (table.shape.size() != 2)
    failSignature(signature, "input table has shape " + shapeToString(table.shape) + ", expected [V, H]");
  std::vector<int64_t> expected = ids.shape;
  expected.push_back(table.shape[1]);
  expectShape(signature, y, expected, "output y");
  GatherContract contract;
  contract.dtype = table.dtype;
  contract.idsDtype = ids.dtype;
  contract.vocabulary = table.shape[0];
  contract.width = table.shape[1];
  return contract;
}

GatherContract parseScatterAddContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 2, 1);
  const Buffer& ids = *signature.inputs[0];
  const Buffer& updates = *signature.inputs[1];
  const Buffer& table = *signature.outputs[0];
  expectDType(signature, ids, {DType::I32, DType::I64}, "input ids");
  expectDType(signature, updates, dtypes, "input updates");
  expectDType(signature, table, {updates.dtype}, "output table");
  if (table.shape.size() != 2)
    failSignature(signature, "output table has shape " + shapeToString(table.shape) + ", expected [V, H]");
  std::vector<int64_t> expected = ids.shape;
  expected.push_back(table.shape[1]);
  expectShape(signature, updates, expected, "input updates");
  GatherContract contract;
  contract.dtype = updates.dtype;
  contract.idsDtype = ids.dtype;
  contract.vocabulary = table.shape[0];
  contract.width = table.shape[1];
  if (hasAttr(signature, "skip_id")) {
    contract.skipId = attrInt(signature, "skip_id");
    if (*contract.skipId < 0 || *contract.skipId >= contract.vocabulary)
      failSignature(signature, "attribute 'skip_id': " + std::to_string(*contract.skipId) +
                                   " is outside the table's rows [0, " + std::to_string(contract.vocabulary) + ")");
  }
  return contract;
}

}  // namespace dgemma
