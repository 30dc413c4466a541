#include "runtime/kernels/moe/Contract.h"

#include <string>

#include "support/Shape.h"

namespace dgemma {
namespace {

// What the router and its backward kernel share: logits [N, E] (input 0), top_k in [1, E] and
// per_expert_scale [E] (input 1).
MoeRouteContract parseLogitsAndScale(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const Buffer& logits = *signature.inputs[0];
  const Buffer& expertScale = *signature.inputs[1];
  expectDType(signature, logits, dtypes, "input logits");
  expectRank(signature, logits, 2, "input logits", "[N, E]");
  MoeRouteContract contract;
  contract.dtype = logits.dtype;
  contract.tokens = logits.shape[0];
  contract.experts = logits.shape[1];
  contract.topK = attrInt(signature, "top_k");
  if (contract.topK < 1 || contract.topK > contract.experts)
    failSignature(signature, "attribute 'top_k': " + std::to_string(contract.topK) + " is outside [1, E = " +
                                 std::to_string(contract.experts) + "]");
  expectDType(signature, expertScale, {logits.dtype}, "input per_expert_scale");
  expectShape(signature, expertScale, {contract.experts}, "input per_expert_scale");
  return contract;
}

// What the experts and their backward kernel share: inputs 0 to 4, x [N, H], weights [N, k],
// indices [N, k], gate_up [E, 2I, H] and down [E, H, I].
MoeExpertsContract parseExpertInputs(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const Buffer& x = *signature.inputs[0];
  const Buffer& weights = *signature.inputs[1];
  const Buffer& indices = *signature.inputs[2];
  const Buffer& gateUp = *signature.inputs[3];
  const Buffer& down = *signature.inputs[4];
  MoeExpertsContract contract;
  contract.dtype = expectSharedDType(
      signature, dtypes, {{&x, "input x"}, {&weights, "input weights"}, {&gateUp, "input gate_up"}, {&down, "input down"}});
  expectDType(signature, indices, {DType::I64}, "input indices");

  expectRank(signature, x, 2, "input x", "[N, H]");
  expectRank(signature, weights, 2, "input weights", "[N, k]");
  expectRank(signature, gateUp, 3, "input gate_up", "[E, 2I, H]");
  contract.tokens = x.shape[0];
  contract.hidden = x.shape[1];
  contract.topK = weights.shape[1];
  contract.experts = gateUp.shape[0];
  if (gateUp.shape[1] % 2 != 0)
    failSignature(signature, "input gate_up has shape " + shapeToString(gateUp.shape) +
                                 ": an odd middle dim cannot hold a gate block and an up block of I rows each");
  contract.expertHidden = gateUp.shape[1] / 2;
  expectShape(signature, weights, {contract.tokens, contract.topK}, "input weights");
  expectShape(signature, indices, {contract.tokens, contract.topK}, "input indices");
  expectShape(signature, gateUp, {contract.experts, 2 * contract.expertHidden, contract.hidden}, "input gate_up");
  expectShape(signature, down, {contract.experts, contract.hidden, contract.expertHidden}, "input down");
  contract.expertOffset = attrInt(signature, "expert_offset");
  if (contract.expertOffset < 0)
    failSignature(signature, "attribute 'expert_offset': " + std::to_string(contract.expertOffset) + " must be >= 0");
  return contract;
}

// gate_up_rows [N·k, 2I] of the data dtype, one row per route.
void expectGateUpRows(const KernelSignature& signature, const MoeExpertsContract& contract, const Buffer& rows,
                      const std::string& role) {
  expectDType(signature, rows, {contract.dtype}, role);
  expectShape(signature, rows, {contract.tokens * contract.topK, 2 * contract.expertHidden}, role);
}

}  // namespace

MoeRouteContract parseMoeRouteContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 2, 2);
  const MoeRouteContract contract = parseLogitsAndScale(signature, dtypes);
  const Buffer& weights = *signature.outputs[0];
  const Buffer& indices = *signature.outputs[1];
  expectDType(signature, weights, {contract.dtype}, "output weights");
  expectDType(signature, indices, {DType::I64}, "output indices");
  expectShape(signature, weights, {contract.tokens, contract.topK}, "output weights");
  expectShape(signature, indices, {contract.tokens, contract.topK}, "output indices");
  return contract;
}

MoeRouteContract parseMoeRouteBackwardContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArity(signature, 4, 2);
  const MoeRouteContract contract = parseLogitsAndScale(signature, dtypes);
  const Buffer& indices = *signature.inputs[2];
  const Buffer& dWeights = *signature.inputs[3];
  expectDType(signature, indices, {DType::I64}, "input indices");
  expectDType(signature, dWeights, {contract.dtype}, "input dweights");
  expectShape(signature, indices, {contract.tokens, contract.topK}, "input indices");
  expectShape(signature, dWeights, {contract.tokens, contract.topK}, "input dweights");
  const Buffer& dLogits = *signature.outputs[0];
  const Buffer& dScale = *signature.outputs[1];
  expectDType(signature, dLogits, {contract.dtype}, "output dlogits");
  expectShape(signature, dLogits, {contract.tokens, contract.experts}, "output dlogits");
  expectDType(signature, dScale, {contract.dtype}, "output dscale");
  expectShape(signature, dScale, {contract.experts}, "output dscale");
  return contract;
}

MoeExpertsContract parseMoeExpertsContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  const size_t outputs = signature.outputs.size();
  if (signature.inputs.size() != 5 || (outputs != 1 && outputs != 2))
    failSignature(signature, "expected 5 inputs and 1 or 2 outputs (y, optionally gate_up_rows), got " +
                                 std::to_string(signature.inputs.size()) + " inputs and " + std::to_string(outputs) +
                                 " outputs");
  MoeExpertsContract contract = parseExpertInputs(signature, dtypes);
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, y, {contract.dtype}, "output y");
  expectShape(signature, y, {contract.tokens, contract.hidden}, "output y");
  contract.gateUpRows = outputs == 2;
  if (contract.gateUpRows) expectGateUpRows(signature, contract, *signature.outputs[1], "output gate_up_rows");
  return contract;
}

MoeExpertsContract parseMoeExpertsBackwardContract(const KernelSignature& signature,
                                                   std::initializer_list<DType> dtypes) {
  expectArityRange(signature, 6, 7, 4);
  MoeExpertsContract contract = parseExpertInputs(signature, dtypes);
  const Buffer& dy = *signature.inputs[5];
  expectDType(signature, dy, {contract.dtype}, "input dy");
  expectShape(signature, dy, {contract.tokens, contract.hidden}, "input dy");
  contract.gateUpRows = signature.inputs.size() == 7;
  if (contract.gateUpRows) expectGateUpRows(signature, contract, *signature.inputs[6], "input gate_up_rows");
  // The gradients of x, weights, gate_up and down (inputs 0, 1, 3 and 4), in that order.
  const size_t gradientOf[] = {0, 1, 3, 4};
  for (size_t i = 0; i < 4; ++i) {
    const std::string role = "output " + std::to_string(i);
    expectDType(signature, *signature.outputs[i], {contract.dtype}, role);
    expectShape(signature, *signature.outputs[i], signature.inputs[gradientOf[i]]->shape, role);
  }
  return contract;
}

}  // namespace dgemma
