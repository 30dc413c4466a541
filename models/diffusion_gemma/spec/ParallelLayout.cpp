#include "models/diffusion_gemma/spec/ParallelLayout.h"

#include <iterator>
#include <map>
#include <numeric>
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

int64_t paddedVocabularySize(int64_t vocabSize, int64_t tensorParallel, int64_t alignment) {
  const int64_t multiple = std::lcm(tensorParallel, alignment);
  return (vocabSize + multiple - 1) / multiple * multiple;
}

void checkParallelLayout(const DiffusionGemmaConfig& config, const ParallelLayout& layout,
                         const std::vector<int64_t>& promptLengths, int64_t canvasLength) {
  const int64_t tp = layout.tensorParallel, dp = layout.dataParallel, ep = layout.expertParallel;
  const int64_t cp = layout.contextParallel;
  if (tp < 1 || dp < 1 || ep < 1 || cp < 1) throw InputError("--tp/--dp/--ep/--cp: expected positive sizes");
  // EP ranks come from the data-parallel ranks of one TP coordinate, as in Megatron Core.
  requireDivides(ep, dp, "--ep", "the data-parallel size --dp");
  // KV heads fewer than TP are replicated, each on TP / heads ranks (docs/parallelism.md, "Tensor
  // parallelism beyond the KV heads"); the rank blocks of the different replication degrees must nest.
  std::map<int64_t, std::string> replicatedHeads;  // KV head count below TP -> the first layer with it
  for (int64_t index = 0; index < config.numHiddenLayers; ++index) {
    const LayerGeometry& layer = config.layer(index);
    const std::string name =
        "layer " + str(index) + (config.isFullAttention(index) ? " (full attention)" : " (sliding)");
    requireDivides(tp, layer.numQueryHeads, "--tp", name + "'s query heads");
    const int64_t kvHeads = layer.numKeyValueHeads;
    if (kvHeads >= tp) {
      requireDivides(tp, kvHeads, "--tp", name + "'s KV heads");
    } else if (tp % kvHeads != 0) {
      throw InputError(
          "--tp " + str(tp) + ": " + name + "'s KV heads (" + str(kvHeads) +
          ") neither divide TP nor are a multiple of it, so they can be neither split nor replicated evenly");
    } else {
      replicatedHeads.emplace(kvHeads, name);
    }
  }
  for (auto smaller = replicatedHeads.begin(); !replicatedHeads.empty() && std::next(smaller) != replicatedHeads.end();
       ++smaller)
    if (auto larger = std::next(smaller); larger->first % smaller->first != 0)
      throw InputError("--tp " + str(tp) + ": " + larger->second + "'s KV heads (" + str(larger->first) + ") and " +
                       smaller->second + "'s (" + str(smaller->first) +
                       ") are replicated over rank blocks that do not nest (the smaller count must divide the larger)");
  requireDivides(tp, config.intermediateSize, "--tp", "the dense MLP width intermediate_size");
  // The vocabulary needs no check: the compiler pads it to a multiple of TP (paddedVocabularySize).
  requireDivides(ep, config.numExperts, "--ep", "the number of experts num_experts");
  if (layout.sequenceParallel) {
    if (tp == 1) throw InputError("--sp: sequence parallelism splits over the TP ranks and needs --tp 2 or more");
    for (int64_t length : promptLengths)
      requireDivides(tp, length, "--tp", "the prompt bucket --prompt-len " + str(length));
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
