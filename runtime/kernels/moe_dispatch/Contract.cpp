#include "runtime/kernels/moe_dispatch/Contract.h"

#include <string>
#include <utility>
#include <vector>

#include "support/Shape.h"

namespace dgemma {
namespace {

// slots [M, k] of i64, input `index`.
void parseSlots(const KernelSignature& signature, size_t index, MoePermutationContract& contract) {
  const Buffer& slots = *signature.inputs[index];
  expectDType(signature, slots, {DType::I64}, "input slots");
  expectRank(signature, slots, 2, "input slots", "[M, k]");
  contract.tokens = slots.shape[0];
  contract.topK = slots.shape[1];
}

// The elements of one row of `buffer` ([rows, ...]).
int64_t trailingElements(const Buffer& buffer) {
  return numElementsOf(std::vector<int64_t>(buffer.shape.begin() + 1, buffer.shape.end()));
}

// `permuted` has M·k rows and `tokens` M, with the same trailing dims.
void expectPermutedShapes(const KernelSignature& signature, const MoePermutationContract& c, const Buffer& permuted,
                          const std::string& permutedRole, const Buffer& tokens, const std::string& tokensRole) {
  if (permuted.shape.empty()) failSignature(signature, permutedRole + " needs rank >= 1 ([M·k, ...])");
  std::vector<int64_t> expected = permuted.shape;
  expected[0] = c.tokens * c.topK;
  expectShape(signature, permuted, expected, permutedRole);
  expected[0] = c.tokens;
  expectShape(signature, tokens, expected, tokensRole);
}

// Inputs 0 (rows [C, H]), `countsIndex` (expert_counts [G, E]) and the two after it (gate_up
// [E, 2I, H], down [E, H, I]).
MoeLocalExpertsContract parseLocalExperts(const KernelSignature& signature, size_t countsIndex,
                                          std::initializer_list<DType> dtypes) {
  const Buffer& rows = *signature.inputs[0];
  const Buffer& counts = *signature.inputs[countsIndex];
  const Buffer& gateUp = *signature.inputs[countsIndex + 1];
  const Buffer& down = *signature.inputs[countsIndex + 2];
  MoeLocalExpertsContract contract;
  contract.dtype = expectSharedDType(signature, dtypes,
                                     {{&rows, "input rows"}, {&gateUp, "input gate_up"}, {&down, "input down"}});
  expectDType(signature, counts, {DType::I64}, "input expert_counts");
  expectRank(signature, rows, 2, "input rows", "[C, H]");
  expectRank(signature, counts, 2, "input expert_counts", "[G, E]");
  expectRank(signature, gateUp, 3, "input gate_up", "[E, 2I, H]");
  contract.rows = rows.shape[0];
  contract.hidden = rows.shape[1];
  contract.peers = counts.shape[0];
  contract.experts = counts.shape[1];
  if (gateUp.shape[1] % 2 != 0)
    failSignature(signature, "input gate_up has shape " + shapeToString(gateUp.shape) +
                                 ": an odd middle dim cannot hold a gate block and an up block of I rows each");
  contract.expertHidden = gateUp.shape[1] / 2;
  expectShape(signature, gateUp, {contract.experts, 2 * contract.expertHidden, contract.hidden}, "input gate_up");
  expectShape(signature, down, {contract.experts, contract.hidden, contract.expertHidden}, "input down");
  return contract;
}

}  // namespace

MoeDispatchContract parseMoeDispatchContract(const KernelSignature& signature) {
  expectArity(signature, 1, 3);
  const Buffer& indices = *signature.inputs[0];
  expectDType(signature, indices, {DType::I64}, "input indices");
  expectRank(signature, indices, 2, "input indices", "[N, k]");
  const Buffer& sendCounts = *signature.outputs[1];
  expectRank(signature, sendCounts, 1, "output send_counts", "[G]");
  MoeDispatchContract contract;
  contract.tokens = indices.shape[0];
  contract.topK = indices.shape[1];
  contract.peers = sendCounts.shape[0];
  const int64_t experts = attrInt(signature, "num_experts");
  if (contract.peers < 1 || experts < 1 || experts % contract.peers != 0)
    failSignature(signature, "attribute 'num_experts': " + std::to_string(experts) +
                                 " is not a positive multiple of the " + std::to_string(contract.peers) + " peers");
  contract.localExperts = experts / contract.peers;
  const char* roles[] = {"output slots", "output send_counts", "output expert_counts"};
  for (size_t i = 0; i < 3; ++i) expectDType(signature, *signature.outputs[i], {DType::I64}, roles[i]);
  expectShape(signature, *signature.outputs[0], indices.shape, roles[0]);
  expectShape(signature, *signature.outputs[2], {contract.peers, contract.localExperts}, roles[2]);
  return contract;
}

MoePermutationContract parseMoePermuteContract(const KernelSignature& signature) {
  expectArity(signature, 2, 1);
  MoePermutationContract contract;
  parseSlots(signature, 1, contract);
  const Buffer& input = *signature.inputs[0];
  const Buffer& result = *signature.outputs[0];
  contract.dtype = input.dtype;
  expectDType(signature, result, {input.dtype}, "output result");
  expectPermutedShapes(signature, contract, result, "output result", input, "input");
  contract.rowElements = trailingElements(input);
  return contract;
}

MoePermutationContract parseMoeCombineContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArityRange(signature, 2, 3, 1);
  MoePermutationContract contract;
  parseSlots(signature, 1, contract);
  const Buffer& rows = *signature.inputs[0];
  const Buffer& result = *signature.outputs[0];
  contract.dtype = expectSharedDType(signature, dtypes, {{&rows, "input rows"}, {&result, "output result"}});
  expectPermutedShapes(signature, contract, rows, "input rows", result, "output result");
  contract.rowElements = trailingElements(rows);
  contract.weighted = signature.inputs.size() == 3;
  if (contract.weighted) {
    const Buffer& weights = *signature.inputs[2];
    expectDType(signature, weights, {contract.dtype}, "input weights");
    expectShape(signature, weights, {contract.tokens, contract.topK}, "input weights");
  }
  return contract;
}

MoeLocalExpertsContract parseMoeLocalExpertsContract(const KernelSignature& signature,
                                                     std::initializer_list<DType> dtypes) {
  expectArity(signature, 4, 1);
  const MoeLocalExpertsContract contract = parseLocalExperts(signature, 1, dtypes);
  const Buffer& result = *signature.outputs[0];
  expectDType(signature, result, {contract.dtype}, "output result");
  expectShape(signature, result, {contract.rows, contract.hidden}, "output result");
  return contract;
}

MoeLocalExpertsContract parseMoeLocalExpertsBackwardContract(const KernelSignature& signature,
                                                             std::initializer_list<DType> dtypes) {
  const bool gradGateUp = !hasAttr(signature, "grad_gate_up") || attrBool(signature, "grad_gate_up");
  const bool gradDown = !hasAttr(signature, "grad_down") || attrBool(signature, "grad_down");
  expectArity(signature, 6, 2 + size_t(gradGateUp) + size_t(gradDown));
  MoeLocalExpertsContract contract = parseLocalExperts(signature, 3, dtypes);
  const Buffer& weights = *signature.inputs[1];
  const Buffer& gradOutput = *signature.inputs[2];
  expectDType(signature, weights, {contract.dtype}, "input weights");
  expectShape(signature, weights, {contract.rows}, "input weights");
  expectDType(signature, gradOutput, {contract.dtype}, "input grad_output");
  expectShape(signature, gradOutput, {contract.rows, contract.hidden}, "input grad_output");
  // The gradients of rows, weights, gate_up and down (inputs 0, 1, 4 and 5), those present, in that order.
  std::vector<std::pair<size_t, const char*>> gradientOf = {{0, "output grad_rows"}, {1, "output grad_weights"}};
  if (gradGateUp) {
    contract.gradGateUpOutput = static_cast<int>(gradientOf.size());
    gradientOf.push_back({4, "output grad_gate_up"});
  }
  if (gradDown) {
    contract.gradDownOutput = static_cast<int>(gradientOf.size());
    gradientOf.push_back({5, "output grad_down"});
  }
  for (size_t i = 0; i < gradientOf.size(); ++i) {
    expectDType(signature, *signature.outputs[i], {contract.dtype}, gradientOf[i].second);
    expectShape(signature, *signature.outputs[i], signature.inputs[gradientOf[i].first]->shape, gradientOf[i].second);
  }
  return contract;
}

}  // namespace dgemma
