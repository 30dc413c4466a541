#include "models/diffusion_gemma/spec/ParallelLayout.h"

#include <string>

#include "support/Error.h"

namespace dgemma {

namespace {

std::string str(int64_t value) { return std::to_string(value); }

void requireDivides(int64_t divisor, int64_t value, const std::string& flag, const std::string& what) {
  if (value % divisor != 0)
    throw InputError(flag + " " + str(divisor) + " does not divide " + what + " (" + str(value) + ")");
}

}  // namespace

void checkParallelLayout(const DiffusionGemmaConfig& config, const ParallelLayout& layout,
                         const std::vector<int64_t>& promptLengths, int64_t canvasLength) {
  const int64_t tp = layout.tensorParallel, dp = layout.dataParallel, ep = layout.expertParallel;
  const int64_t cp = layout.contextParallel;
  if (tp < 1 || dp < 1 || ep < 1 || cp < 1) throw InputError("--tp/--dp/--ep/--cp: expected positive sizes");
  if (tp > kMaxTensorParallel)
    throw InputError("--tp " + str(tp) + ": the tensor-parallel mapping supports TP 1 and 2 (a full-attention layer's " +
                     "KV heads are not replicated across TP ranks; docs/parallelism.md, \"Divisibility\")");
  // EP ranks come from the data-parallel ranks of one TP coordinate, as in Megatron Core.
  requireDivides(ep, dp, "--ep", "the data-parallel size --dp");
  for (int64_t index = 0; index < config.numHiddenLayers; ++index) {
    const LayerGeometry& layer = config.layer(index);
    const std::string name = "layer " + str(index) + (config.isFullAttention(index) ? " (full attention)" : " (sliding)");
    requireDivides(tp, layer.numQueryHeads, "--tp", name + "'s query heads");
    requireDivides(tp, layer.numKeyValueHeads, "--tp", name + "'s KV heads");
  }
  requireDivides(tp, config.intermediateSize, "--tp", "the dense MLP width intermediate_size");
  // Megatron pads such a vocabulary; the vocab-parallel head here refuses it instead.
  if (config.vocabSize % tp != 0)
    throw InputError("--tp " + str(tp) + " does not divide the vocabulary size vocab_size (" + str(config.vocabSize) +
                     "); the vocabulary is not padded for tensor parallelism");
  requireDivides(ep, config.numExperts, "--ep", "the number of experts num_experts");
  if (layout.sequenceParallel) {
    if (tp == 1) throw InputError("--sp: sequence parallelism splits over the TP ranks and needs --tp 2");
    for (int64_t length : promptLengths) requireDivides(tp, length, "--tp", "the prompt bucket --prompt-len " + str(length));
    requireDivides(tp, canvasLength, "--tp", "the canvas length canvas_length");
  }
  if (cp > 1) {
    // The clean pass (P + L) and the prompt's K/V pass (P) cut their sequence into 2 CP chunks, two
    // per context rank (the causal load balancing), and under SP each rank's part again over TP.
    const int64_t chunks = 2 * cp * (layout.sequenceParallel ? tp : 1);
    const std::string what = "--cp " + str(cp) + (layout.sequenceParallel ? " with --tp " + str(tp) + " --sp" : "");
    for (int64_t length : promptLengths)
      if (length % chunks != 0)
        throw InputError(what + " needs every prompt bucket to be a multiple of " + str(chunks) + ": --prompt-len " +
                         str(length) + " is not (the encoder's sequence splits into 2 chunks per context rank)");
    if (canvasLength % chunks != 0)
      throw InputError(what + " needs the canvas length canvas_length (" + str(canvasLength) +
                       ") to be a multiple of " + str(chunks) + " (the clean pass's sequence is prompt + canvas)");
  }
}

}  // namespace dgemma
