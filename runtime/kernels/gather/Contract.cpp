#include "runtime/kernels/gather/Contract.h"

#include <string>
#include <vector>

namespace dgemma {
namespace {

// The shapes both kernels share, once the dtypes are checked: a table [V, H] and rows [ids..., H] of
// the table's dtype, one per id. The roles name the buffers as each kernel's errors do.
GatherContract parseTableAndRows(const KernelSignature& signature, const Buffer& ids, const Buffer& table,
                                 const std::string& tableRole, const Buffer& rows, const std::string& rowsRole) {
  expectRank(signature, table, 2, tableRole, "[V, H]");
  std::vector<int64_t> expected = ids.shape;
  expected.push_back(table.shape[1]);
  expectShape(signature, rows, expected, rowsRole);
  GatherContract contract;
  contract.dtype = table.dtype;
  contract.idsDtype = ids.dtype;
  contract.vocabulary = table.shape[0];
  contract.width = table.shape[1];
  contract.rowOffset = attrInt(signature, "row_offset");
  if (contract.rowOffset < 0)
    failSignature(signature, "attribute 'row_offset': " + std::to_string(contract.rowOffset) + " must be >= 0");
  return contract;
}

void expectIds(const KernelSignature& signature, const Buffer& ids) {
  expectDType(signature, ids, {DType::I32, DType::I64}, "input ids");
}

}  // namespace

GatherContract parseGatherContract(const KernelSignature& signature) {
  expectArity(signature, 2, 1);
  const Buffer& table = *signature.inputs[0];
  const Buffer& ids = *signature.inputs[1];
  const Buffer& y = *signature.outputs[0];
  expectIds(signature, ids);
  expectDType(signature, y, {table.dtype}, "output y");
  return parseTableAndRows(signature, ids, table, "input table", y, "output y");
}

GatherContract parseScatterAddContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 2, 1);
  const Buffer& ids = *signature.inputs[0];
  const Buffer& updates = *signature.inputs[1];
  const Buffer& table = *signature.outputs[0];
  expectIds(signature, ids);
  expectDType(signature, updates, dtypes, "input updates");
  expectDType(signature, table, {updates.dtype}, "output table");
  GatherContract contract = parseTableAndRows(signature, ids, table, "output table", updates, "input updates");
  if (hasAttr(signature, "skip_id")) {
    contract.skipId = attrInt(signature, "skip_id");
    // A global row, which may lie outside this table's block of rows (then nothing here is skipped).
    if (*contract.skipId < 0)
      failSignature(signature, "attribute 'skip_id': " + std::to_string(*contract.skipId) + " must be >= 0");
  }
  return contract;
}

}  // namespace dgemma
