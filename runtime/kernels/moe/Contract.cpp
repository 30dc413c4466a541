#include "runtime/kernels/moe/Contract.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

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

// Which adapter pairs the step carries (attributes lora_gate_up and lora_down), and their count.
struct AdapterPairs {
  bool gateUp = false, down = false;
  int count() const { return int(gateUp) + int(down); }
};

AdapterPairs adapterPairsOf(const KernelSignature& signature) {
  AdapterPairs pairs;
  pairs.gateUp = hasAttr(signature, "lora_gate_up") && attrBool(signature, "lora_gate_up");
  pairs.down = hasAttr(signature, "lora_down") && attrBool(signature, "lora_down");
  return pairs;
}

// The adapter pairs from input `first` on, of the data dtype and the shapes of Contract.h, with one
// rank and a finite lora_scale.
void parseAdapters(const KernelSignature& signature, MoeExpertsContract& contract, AdapterPairs pairs, int first) {
  if (pairs.count() == 0) return;
  contract.loraScale = attrDouble(signature, "lora_scale");
  if (!std::isfinite(contract.loraScale))
    failSignature(signature, "attribute 'lora_scale' must be finite, got " + std::to_string(contract.loraScale));
  const int64_t e = contract.experts, h = contract.hidden, i = contract.expertHidden;
  int next = first;
  auto pair = [&](const std::string& name, int64_t fanIn, int64_t fanOut) {
    const Buffer& a = *signature.inputs[next];
    const Buffer& b = *signature.inputs[next + 1];
    const std::string aRole = "input " + name + " A", bRole = "input " + name + " B";
    expectDType(signature, a, {contract.dtype}, aRole);
    expectDType(signature, b, {contract.dtype}, bRole);
    expectRank(signature, a, 3, aRole, "[E, r, " + std::to_string(fanIn) + "]");
    if (contract.loraRank == 0) contract.loraRank = a.shape[1];
    if (contract.loraRank < 1)
      failSignature(signature, aRole + " has shape " + shapeToString(a.shape) + ": the rank r must be >= 1");
    expectShape(signature, a, {e, contract.loraRank, fanIn}, aRole);
    expectShape(signature, b, {e, fanOut, contract.loraRank}, bRole);
    const int at = next;
    next += 2;
    return at;
  };
  if (pairs.gateUp) contract.loraGateUpInput = pair("lora_gate_up", h, 2 * i);
  if (pairs.down) contract.loraDownInput = pair("lora_down", i, h);
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
  const AdapterPairs pairs = adapterPairsOf(signature);
  const size_t inputs = 5 + 2 * pairs.count(), outputs = signature.outputs.size();
  if (signature.inputs.size() != inputs || (outputs != 1 && outputs != 2))
    failSignature(signature, "expected " + std::to_string(inputs) + " inputs" +
                                 (pairs.count() > 0 ? " (5 and two per adapter pair)" : "") +
                                 " and 1 or 2 outputs (y, optionally gate_up_rows), got " +
                                 std::to_string(signature.inputs.size()) + " inputs and " + std::to_string(outputs) +
                                 " outputs");
  MoeExpertsContract contract = parseExpertInputs(signature, dtypes);
  parseAdapters(signature, contract, pairs, 5);
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, y, {contract.dtype}, "output y");
  expectShape(signature, y, {contract.tokens, contract.hidden}, "output y");
  contract.gateUpRows = outputs == 2;
  if (contract.gateUpRows) expectGateUpRows(signature, contract, *signature.outputs[1], "output gate_up_rows");
  return contract;
}

MoeExpertsContract parseMoeExpertsBackwardContract(const KernelSignature& signature,
                                                   std::initializer_list<DType> dtypes) {
  const AdapterPairs pairs = adapterPairsOf(signature);
  const bool gradGateUp = !hasAttr(signature, "grad_gate_up") || attrBool(signature, "grad_gate_up");
  const bool gradDown = !hasAttr(signature, "grad_down") || attrBool(signature, "grad_down");
  const size_t adapterInputs = 2 * pairs.count();
  const size_t outputs = 2 + size_t(gradGateUp) + size_t(gradDown) + adapterInputs;
  expectArityRange(signature, 6 + adapterInputs, 7 + adapterInputs, outputs);
  MoeExpertsContract contract = parseExpertInputs(signature, dtypes);
  const Buffer& dy = *signature.inputs[5];
  expectDType(signature, dy, {contract.dtype}, "input dy");
  expectShape(signature, dy, {contract.tokens, contract.hidden}, "input dy");
  contract.gateUpRows = signature.inputs.size() == 7 + adapterInputs;
  if (contract.gateUpRows) expectGateUpRows(signature, contract, *signature.inputs[6], "input gate_up_rows");
  parseAdapters(signature, contract, pairs, contract.gateUpRows ? 7 : 6);
  // The gradients in order, each of its input's shape: x, weights, then those present.
  std::vector<std::pair<int, std::string>> gradientOf = {{0, "dx"}, {1, "dweights"}};
  int next = 2;
  if (gradGateUp) {
    contract.gradGateUpOutput = next++;
    gradientOf.push_back({3, "dgate_up"});
  }
  if (gradDown) {
    contract.gradDownOutput = next++;
    gradientOf.push_back({4, "ddown"});
  }
  if (pairs.gateUp) {
    contract.gradLoraGateUpOutput = next;
    next += 2;
    gradientOf.push_back({contract.loraGateUpInput, "dlora_gate_up A"});
    gradientOf.push_back({contract.loraGateUpInput + 1, "dlora_gate_up B"});
  }
  if (pairs.down) {
    contract.gradLoraDownOutput = next;
    next += 2;
    gradientOf.push_back({contract.loraDownInput, "dlora_down A"});
    gradientOf.push_back({contract.loraDownInput + 1, "dlora_down B"});
  }
  for (size_t i = 0; i < gradientOf.size(); ++i) {
    const std::string role = "output " + std::to_string(i) + " (" + gradientOf[i].second + ")";
    expectDType(signature, *signature.outputs[i], {contract.dtype}, role);
    expectShape(signature, *signature.outputs[i], signature.inputs[gradientOf[i].first]->shape, role);
  }
  return contract;
}

}  // namespace dgemma
