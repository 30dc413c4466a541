#include "runtime/kernels/cross_entropy/Contract.h"

#include <string>
#include <vector>

#include "support/Shape.h"

namespace dgemma {
namespace {

// Checks logits [..., V], targets [...], the optional bonus ids and bonus [...], then for the backward
// kernel grad_output [...] and grad_logits (the logits' shape), else the loss [...].
CrossEntropyContract parseRowsAndOutput(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                        bool backward) {
  const size_t extra = backward ? 1 : 0;
  expectArityRange(signature, 2 + extra, 4 + extra, 1);
  if (signature.inputs.size() == 3 + extra)
    failSignature(signature, "bonus ids and bonus come together: expected " + std::to_string(2 + extra) + " or " +
                                 std::to_string(4 + extra) + " inputs");
  const Buffer& logits = *signature.inputs[0];
  const Buffer& targets = *signature.inputs[1];
  expectDType(signature, logits, dtypes, "input logits");
  if (logits.shape.empty()) failSignature(signature, "input logits has shape [], expected [..., V]");
  const std::vector<int64_t> positions(logits.shape.begin(), logits.shape.end() - 1);
  expectDType(signature, targets, {DType::I32, DType::I64}, "input targets");
  expectShape(signature, targets, positions, "input targets");
  CrossEntropyContract geometry;
  geometry.dtype = logits.dtype;
  geometry.rows = numElementsOf(positions);
  geometry.vocabulary = logits.shape.back();
  geometry.wideTargets = targets.dtype == DType::I64;
  geometry.softcap = attrDouble(signature, "softcap");
  if (!(geometry.softcap >= 0)) failSignature(signature, "attribute 'softcap': expected a number >= 0 (0: none)");
  geometry.hasBonus = signature.inputs.size() == 4 + extra;
  if (geometry.hasBonus) {
    const Buffer& bonusIds = *signature.inputs[2];
    const Buffer& bonus = *signature.inputs[3];
    expectDType(signature, bonusIds, {DType::I32, DType::I64}, "input bonus_ids");
    expectShape(signature, bonusIds, positions, "input bonus_ids");
    expectDType(signature, bonus, {logits.dtype}, "input bonus");
    expectShape(signature, bonus, positions, "input bonus");
    geometry.wideBonusIds = bonusIds.dtype == DType::I64;
  }
  if (backward) {
    const Buffer& gradOutput = *signature.inputs.back();
    expectDType(signature, gradOutput, {logits.dtype}, "input grad_output");
    expectShape(signature, gradOutput, positions, "input grad_output");
  }
  const Buffer& output = *signature.outputs[0];
  expectDType(signature, output, {logits.dtype}, backward ? "output grad_logits" : "output loss");
  expectShape(signature, output, backward ? logits.shape : positions, backward ? "output grad_logits" : "output loss");
  return geometry;
}

}  // namespace

CrossEntropyContract parseCrossEntropyContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  return parseRowsAndOutput(signature, dtypes, false);
}

CrossEntropyContract parseCrossEntropyBackwardContract(const KernelSignature& signature,
                                                       std::initializer_list<DType> dtypes) {
  return parseRowsAndOutput(signature, dtypes, true);
}

std::string idOutsideVocabularyMessage(const std::string& where, const std::string& role, int64_t id, int64_t index,
                                       int64_t vocabulary) {
  return where + ": " + role + " id " + std::to_string(id) + " at flat index " + std::to_string(index) +
         " is outside the vocabulary [0, " + std::to_string(vocabulary) + ")";
}

}  // namespace dgemma
