#include "runtime/kernels/attention/Contract.h"

#include <string>

namespace dgemma {
namespace {

AttentionMask maskAttribute(const KernelSignature& signature) {
  const std::string name = attrString(signature, "mask");
  if (name == "causal") return AttentionMask::Causal;
  if (name == "bidirectional") return AttentionMask::Bidirectional;
  if (name == "prefix") return AttentionMask::Prefix;
  failSignature(signature, "attribute 'mask': expected causal, bidirectional or prefix, got '" + name + "'");
}

// Checks q, k, v, key_valid (inputs 0..3), the optional segment_ids and document_ids (from input
// `firstOptional` on) and the attributes; `o` is a buffer of q's batch, queries and heads with Dv values (the output, or the
// output gradient of the backward kernel).
AttentionContract parseInputsAndAttributes(const KernelSignature& signature, std::initializer_list<DType> dtypes,
                                           const Buffer& o, const std::string& oRole, size_t firstOptional) {
  const Buffer& q = *signature.inputs[0];
  const Buffer& k = *signature.inputs[1];
  const Buffer& v = *signature.inputs[2];
  const Buffer& keyValid = *signature.inputs[3];
  AttentionContract g;
  g.dtype = expectSharedDType(signature, dtypes, {{&q, "input q"}, {&k, "input k"}, {&v, "input v"}, {&o, oRole}});
  expectDType(signature, keyValid, {DType::U8, DType::Bool}, "input key_valid");

  expectRank(signature, q, 4, "input q", "[B, Tq, Hq, D]");
  expectRank(signature, k, 4, "input k", "[B, Tk, Hkv, D]");
  expectRank(signature, v, 4, "input v", "[B, Tk, Hkv, Dv]");
  g.batch = q.shape[0];
  g.queries = q.shape[1];
  g.queryHeads = q.shape[2];
  g.headDim = q.shape[3];
  g.keys = k.shape[1];
  g.kvHeads = k.shape[2];
  g.valueDim = v.shape[3];
  expectShape(signature, k, {g.batch, g.keys, g.kvHeads, g.headDim}, "input k");
  if (g.kvHeads == 0 || g.queryHeads % g.kvHeads != 0)
    failSignature(signature, "query heads Hq=" + std::to_string(g.queryHeads) +
                                 " are not a multiple of key/value heads Hkv=" + std::to_string(g.kvHeads));
  expectShape(signature, v, {g.batch, g.keys, g.kvHeads, g.valueDim}, "input v");
  expectShape(signature, keyValid, {g.batch, g.keys}, "input key_valid");
  expectShape(signature, o, {g.batch, g.queries, g.queryHeads, g.valueDim}, oRole);

  g.mask = maskAttribute(signature);
  g.window = attrInt(signature, "window");
  if (g.window < 0)
    failSignature(signature, "attribute 'window': expected a non-negative integer, got " + std::to_string(g.window));
  g.prefixLen = attrInt(signature, "prefix_len");
  if (g.mask == AttentionMask::Prefix && (g.prefixLen < 0 || g.prefixLen > g.keys))
    failSignature(signature, "attribute 'prefix_len': " + std::to_string(g.prefixLen) + " is outside [0, Tk = " +
                                 std::to_string(g.keys) + "]");
  if (g.mask != AttentionMask::Prefix && g.prefixLen != 0)
    failSignature(signature, "attribute 'prefix_len' applies only to mask 'prefix'");
  if (g.mask == AttentionMask::Causal && g.queries > g.keys)
    failSignature(signature, "mask 'causal' needs Tq <= Tk (the queries are the last Tq key positions), got Tq=" +
                                 std::to_string(g.queries) + ", Tk=" + std::to_string(g.keys));
  g.scale = attrDouble(signature, "scale");
  if (g.mask == AttentionMask::Bidirectional && g.window > 0 && g.queries > g.keys)
    failSignature(signature,
                  "mask 'bidirectional' with a window needs Tq <= Tk (the window is centred on the query's "
                  "key position Tk - Tq + i), got Tq=" +
                      std::to_string(g.queries) + ", Tk=" + std::to_string(g.keys));

  if (hasAttr(signature, "trailing_keys")) {
    g.trailingKeys = attrInt(signature, "trailing_keys");
    if (g.trailingKeys < 0 || (g.trailingKeys > 0 && g.queries + g.trailingKeys > g.keys))
      failSignature(signature, "attribute 'trailing_keys': " + std::to_string(g.trailingKeys) +
                                   " is outside [0, Tk - Tq = " + std::to_string(g.keys - g.queries) + "]");
  }

  g.documented = hasAttr(signature, "has_document_ids") && attrBool(signature, "has_document_ids");
  // The optional inputs: document_ids when the attribute says so, and segment_ids before it if one more.
  const size_t optionalInputs = signature.inputs.size() - firstOptional, documentInputs = g.documented ? 1 : 0;
  if (optionalInputs < documentInputs || optionalInputs > documentInputs + 1)
    failSignature(signature, "with attribute 'has_document_ids' = " + std::string(g.documented ? "true" : "false") +
                                 ", expected " + std::to_string(firstOptional + documentInputs) + " or " +
                                 std::to_string(firstOptional + documentInputs + 1) + " inputs, got " +
                                 std::to_string(signature.inputs.size()));
  g.segmented = optionalInputs > documentInputs;
  g.segmentInput = firstOptional;
  g.documentInput = firstOptional + (g.segmented ? 1 : 0);
  if (g.documented) {
    const Buffer& documentIds = *signature.inputs[g.documentInput];
    expectDType(signature, documentIds, {DType::I64}, "input document_ids");
    expectShape(signature, documentIds, {g.batch, g.keys}, "input document_ids");
    if (g.queries > g.keys)
      failSignature(signature,
                    "input document_ids needs Tq <= Tk (a query's document is that of its key position "
                    "Tk - Tq + i), got Tq=" +
                        std::to_string(g.queries) + ", Tk=" + std::to_string(g.keys));
  }
  if (g.segmented) {
    const Buffer& segmentIds = *signature.inputs[g.segmentInput];
    expectDType(signature, segmentIds, {DType::I64}, "input segment_ids");
    expectShape(signature, segmentIds, {g.batch, g.keys}, "input segment_ids");
    if (g.mask != AttentionMask::Causal) failSignature(signature, "input segment_ids applies only to mask 'causal'");
  }
  return g;
}

}  // namespace

AttentionContract parseAttentionContract(const KernelSignature& signature, std::initializer_list<DType> dtypes) {
  expectArityRange(signature, 4, 6, 1);
  return parseInputsAndAttributes(signature, dtypes, *signature.outputs[0], "output o", 4);
}

AttentionContract parseAttentionBackwardContract(const KernelSignature& signature,
                                                 std::initializer_list<DType> dtypes) {
  expectArityRange(signature, 5, 7, 3);
  const AttentionContract contract = parseInputsAndAttributes(signature, dtypes, *signature.inputs[4], "input do", 5);
  expectShape(signature, *signature.outputs[0], signature.inputs[0]->shape, "output dq");
  expectShape(signature, *signature.outputs[1], signature.inputs[1]->shape, "output dk");
  expectShape(signature, *signature.outputs[2], signature.inputs[2]->shape, "output dv");
  for (size_t i = 0; i < 3; ++i)
    expectDType(signature, *signature.outputs[i], {contract.dtype}, "output " + std::to_string(i));
  return contract;
}

}  // namespace dgemma
