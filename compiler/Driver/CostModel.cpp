// The analytic cost model of --auto-layout (CostModel.h; docs/parallelism.md, "Layout search").
#include "compiler/Driver/CostModel.h"

#include <algorithm>
#include <regex>

#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "support/Error.h"

namespace dgemma {

namespace {

constexpr double kTera = 1e12, kGiga = 1e9;

// Datasheet peaks; the efficiency factors are documented in docs/parallelism.md, "Layout search".
// Fields: name, dense bf16 FLOP/s, fp32 FLOP/s, HBM bytes/s, memory, NVLink and inter-node bytes/s
// per direction, GPUs per node, compute efficiency, link (and HBM) efficiency.
const std::vector<Accelerator>& accelerators() {
  static const std::vector<Accelerator> all = {
      // Host link: PCIe Gen5 x16 (64 GB/s a direction). Host memory: two sockets of 8-channel
      // DDR5-4800 (2 x 307 GB/s) shared by the node's 8 GPUs.
      {"h200", 989 * kTera, 67 * kTera, 4.8 * kTera, uint64_t{141} << 30, 450 * kGiga, 50 * kGiga, 8, 0.45, 0.7,
       64 * kGiga, 614.0 / 8 * kGiga},
      {"h100", 989 * kTera, 67 * kTera, 3.35 * kTera, uint64_t{80} << 30, 450 * kGiga, 50 * kGiga, 8, 0.45, 0.7,
       64 * kGiga, 614.0 / 8 * kGiga},
  };
  return all;
}

// The fraction of a buffer each rank receives in a ring collective over g ranks.
double ringShare(int64_t group) { return group > 1 ? double(group - 1) / double(group) : 0.0; }

// What one pass of the text stack runs over, per example (a data-parallel rank runs micro-batch
// examples): query positions, attended key positions per query, positions reaching the head.
struct Pass {
  int64_t length = 0;   // query positions per example
  int64_t keys = 0;     // key positions per example (the IR's attention counts every key)
  int64_t scored = 0;   // positions per example through the head
  bool decoder = false; // the decoder concatenates the prompt's K/V with its own
  bool backward = true; // pass 1 of self-conditioning runs without gradient
  // The prompt's K/V pass: the last layer's attention output and feed-forward reach nothing, so
  // the compiler drops them; that layer runs only its K/V projections.
  bool keyValuesOnly = false;
  // The layers that run whole.
  int64_t wholeLayers(const DiffusionGemmaConfig& config) const { return config.numHiddenLayers - (keyValuesOnly ? 1 : 0); }
};

// The layout's divisors: column-split tensors over TP; [tokens, H] tensors over TP only with SP;
// the experts see a TP rank's tokens (all of them without SP).
struct Splits {
  int64_t tp, sequence, ep, dp, edp;
  // The ranks whose tokens the compiled all-gather form of expert parallelism gathers to every
  // rank: the EP group (the experts' tokens keep their split over the expert-data-parallel
  // replicas), and over TP with SP; 1 without EP.
  int64_t expertGather;
  explicit Splits(const ParallelLayout& layout)
      : tp(layout.tensorParallel), sequence(layout.sequenceParallel ? layout.tensorParallel : 1), ep(layout.expertParallel),
        dp(layout.dataParallel), edp(layout.expertDataParallel()),
        expertGather(layout.expertParallel > 1 ? layout.expertParallel * sequence : 1) {}
};

struct LayerActivations {
  double layerInput = 0;      // what full recomputation keeps
  double matmulOutputs = 0;   // what selective recomputation keeps besides the layer input
  double recomputable = 0;    // norms, elementwise, RoPE, attention core: dropped by selective
  double total() const { return layerInput + matmulOutputs + recomputable; }
};

// The tensors one layer's forward leaves for its backward on one rank, per pass: what the
// derivative rules read (a linear its input, a norm its input, gelu and the products their
// operands, attention its q/k/v and output, the router its logits), each counted once.
LayerActivations layerActivations(const DiffusionGemmaConfig& config, int64_t layer, const Pass& pass, int64_t microBatch,
                                  const Splits& splits, double activation) {
  const double f32 = 4, index = 8, hidden = double(config.hiddenSize);
  const double tokens = double(microBatch * pass.length);
  const double localTokens = tokens / double(splits.sequence);  // SP region
  const double queryWidth = double(config.queryWidth(layer)) / double(splits.tp);
  const double kvWidth = double(config.keyValueWidth(layer)) / double(splits.tp);
  const double valueProjection = config.hasValueProjection(layer) ? 1 : 0;
  const double inner = double(config.intermediateSize) / double(splits.tp);
  const double routes = localTokens * double(config.topKExperts);
  LayerActivations bytes;
  bytes.layerInput = localTokens * hidden * activation;
  // Raw q, k, (v) projections, the o_proj and dense down outputs, gate and up, the router logits,
  // and with EP the experts' input, routing weights and indices gathered over the expert group (the
  // all-gather form, dgemma-compile's default; docs/parallelism.md, "Expert parallelism").
  bytes.matmulOutputs = tokens * (queryWidth + (1 + valueProjection) * kvWidth) * activation + 2 * localTokens * hidden * activation +
                        2 * tokens * inner * activation + localTokens * double(config.numExperts) * f32;
  if (splits.ep > 1) bytes.matmulOutputs += double(splits.expertGather) * localTokens * (hidden * activation + double(config.topKExperts) * (f32 + index));
  // With SP the q/k/v and dense MLP inputs are all-gathered: the gathered copies are what they read.
  const double normOutputs = splits.sequence > 1 ? 2 * tokens * hidden * activation : 2 * localTokens * hidden * activation;
  bytes.recomputable = normOutputs +
                       // q after norm and RoPE, k after norm and RoPE, v after its norm, the attention output
                       tokens * (2 * queryWidth + 2 * kvWidth) * activation +
                       // the residuals and the other norms' inputs and outputs, the experts' input and output
                       6 * localTokens * hidden * activation +
                       // gelu(gate) and the gated product
                       2 * tokens * inner * activation +
                       // the router's f32 island and its routes (weights, indices)
                       2 * localTokens * hidden * f32 + routes * (f32 + index);
  // Where a rank holds every expert, the experts hand their backward each route's gate and up
  // pre-activations (dg-keep-expert-activations); recomputing the experts rebuilds them.
  // They are f32 under bf16 too (the experts' precision).
  if (splits.ep == 1) bytes.recomputable += routes * 2 * double(config.moeIntermediateSize) * f32;
  // The decoder's attention reads the concatenated prompt + canvas K/V of every layer.
  if (pass.decoder) bytes.recomputable += 2 * double(microBatch * pass.keys) * kvWidth * activation;
  return bytes;
}

// Per-rank FLOPs of one pass's forward (CostOpInterface's counts: a multiply-add is 2; attention
// rows x keys x (4 d + 5)). `expertsBound` counts the experts over every token of the EP group,
// as the all-gather form's dg.moe_experts does; a rank computes only its own experts' routes.
struct PassFlops {
  double layers = 0, attentionCore = 0, experts = 0, expertsBound = 0, head = 0;
  // What an attention kernel that skips the blocks outside a sliding layer's window computes.
  double attentionCoreWindowed = 0;
};

PassFlops passFlops(const DiffusionGemmaConfig& config, const Pass& pass, int64_t microBatch, const Splits& splits) {
  PassFlops flops;
  const double hidden = double(config.hiddenSize);
  const double tokens = double(microBatch * pass.length);
  const double localTokens = tokens / double(splits.sequence);
  for (int64_t layer = 0; layer < config.numHiddenLayers; ++layer) {
    const LayerGeometry& geometry = config.layer(layer);
    if (layer >= pass.wholeLayers(config)) {  // K/V projections only
      flops.layers += 2 * tokens * hidden * (config.hasValueProjection(layer) ? 2 : 1) * double(config.keyValueWidth(layer)) / double(splits.tp);
      continue;
    }
    const double queryWidth = double(config.queryWidth(layer)) / double(splits.tp);
    const double kvWidth = double(config.keyValueWidth(layer)) / double(splits.tp);
    const double kvProjections = config.hasValueProjection(layer) ? 2 : 1;
    flops.layers += 2 * tokens * hidden * (2 * queryWidth + kvProjections * kvWidth);  // q, k, (v), o
    flops.layers += 2 * tokens * hidden * 3 * double(config.intermediateSize) / double(splits.tp);  // dense MLP
    flops.layers += 2 * localTokens * hidden * double(config.numExperts);                          // router
    const double rows = tokens * double(geometry.numQueryHeads) / double(splits.tp);
    flops.attentionCore += rows * double(pass.keys) * double(4 * geometry.headDim + 5);
    const int64_t visibleKeys = geometry.type == AttentionLayerType::Sliding ? std::min(pass.keys, config.slidingWindow) : pass.keys;
    flops.attentionCoreWindowed += rows * double(visibleKeys) * double(4 * geometry.headDim + 5);
  }
  const double routes = localTokens * double(config.topKExperts) * double(pass.wholeLayers(config));
  flops.experts = routes * (6 * hidden * double(config.moeIntermediateSize));
  flops.expertsBound = flops.experts * double(splits.expertGather);
  flops.head = 2 * double(microBatch * pass.scored) * hidden * double(config.paddedVocabSize) / double(splits.tp);
  return flops;
}

// Bytes one rank receives in one pass, forward and backward apart: Megatron's two [tokens, H]
// exchanges per layer over TP (an all-reduce, or with SP an all-gather plus a reduce-scatter: the
// same bytes) and the embedding lookup's sum over TP; per MoE layer over EP the all-gather form the
// compiled train step has (docs/parallelism.md, "Expert parallelism"): the forward gathers the
// tokens, routing weights and indices and reduce-scatters the output, the backward gathers the
// output gradient and reduce-scatters the input and routing-weight gradients.
struct PassCommunication {
  double tensorParallel = 0;  // each direction
  double expertsForward = 0, expertsBackward = 0;
};

PassCommunication passCommunication(const DiffusionGemmaConfig& config, const Pass& pass, int64_t microBatch,
                                    const Splits& splits, double activation) {
  PassCommunication bytes;
  const double hidden = double(config.hiddenSize), f32 = 4, index = 8, slots = double(config.topKExperts);
  const double tokens = double(microBatch * pass.length);
  const double exchange = 2 * ringShare(splits.tp) * tokens * hidden * activation;  // one all-reduce's worth
  bytes.tensorParallel = (2 * double(pass.wholeLayers(config)) + 1) * exchange;
  const double others = double(splits.expertGather - 1), localTokens = tokens / double(splits.sequence);
  const double layers = double(pass.wholeLayers(config));
  bytes.expertsForward = layers * others * localTokens * (2 * hidden * activation + slots * (f32 + index));
  bytes.expertsBackward = layers * others * localTokens * (2 * hidden * activation + slots * f32);
  return bytes;
}

struct ParameterShard {
  double parameters = 0;      // elements of every text tensor on this rank
  double trainableDense = 0;  // trainable non-expert elements on this rank
  double trainableExperts = 0;
};

// How many ways TP splits a text tensor: a layer's k_proj and v_proj split into at most its KV
// heads, each replicated over the remaining TP ranks (docs/parallelism.md, "Tensor parallelism beyond
// the KV heads").
int64_t tensorSplitOf(const DiffusionGemmaConfig& config, const std::string& name, int64_t tp) {
  static const std::regex keyValue(R"(^model\.decoder\.layers\.(\d+)\.self_attn\.[kv]_proj\.weight$)");
  std::smatch match;
  if (!std::regex_match(name, match, keyValue)) return tp;
  return std::min(tp, config.layer(std::stoll(match[1].str())).numKeyValueHeads);
}

ParameterShard parameterShard(const DiffusionGemmaConfig& config, const Splits& splits) {
  ParameterShard shard;
  for (const ExpectedTensor& tensor : expectedTextWeights(config)) {
    double elements = 1;
    for (int64_t size : tensor.shape) elements *= double(size);
    const std::string_view role = tensorParallelRole(tensor.name);
    if (role == "experts") elements /= double(splits.ep);
    else if (role != "replicated") elements /= double(tensorSplitOf(config, tensor.name, splits.tp));
    shard.parameters += elements;
    if (tensor.isBuffer) continue;
    (role == "experts" ? shard.trainableExperts : shard.trainableDense) += elements;
  }
  return shard;
}

// The sustained bandwidth of a group that spans `span` consecutive ranks (TP is innermost): the
// intra-node link within gpusPerNode, the network beyond.
double bandwidth(const Accelerator& accelerator, int64_t span) {
  const double peak = span > accelerator.gpusPerNode ? accelerator.networkBytesPerSecond : accelerator.linkBytesPerSecond;
  return peak * accelerator.linkEfficiency;
}

}  // namespace

HostOffloadSeconds predictHostOffload(const Accelerator& accelerator, uint64_t pcieBytes, uint64_t hostUpdateBytes) {
  return {double(pcieBytes) / (accelerator.hostLinkBytesPerSecond * accelerator.linkEfficiency),
          double(hostUpdateBytes) / (accelerator.hostMemoryBytesPerSecond * accelerator.linkEfficiency)};
}

const Accelerator& findAccelerator(const std::string& name) {
  for (const Accelerator& accelerator : accelerators())
    if (accelerator.name == name) return accelerator;
  throw InputError("--gpu: unknown accelerator \"" + name + "\" (known: " + acceleratorNames() + ")");
}

std::string acceleratorNames() {
  std::string names;
  for (const Accelerator& accelerator : accelerators()) names += (names.empty() ? "" : ", ") + accelerator.name;
  return names;
}

std::string recomputeName(RecomputePolicy policy) { return mlir::dg::RecomputePolicy{policy, 1}.name(); }

CostPrediction predictCost(const DiffusionGemmaConfig& config, const TrainingShape& shape, const Candidate& candidate,
                           const Accelerator& accelerator) {
  const Splits splits(candidate.layout);
  const double activation = shape.bf16 ? 2 : 4, f32 = 4;
  const int64_t prompt = shape.promptLength, canvas = shape.canvasLength;

  // The train_step's passes (docs/training.md, "The objective"): the prompt's K/V pass, pass 1 of
  // self-conditioning (forward only), pass 2, and the clean encoder pass over prompt + canvas. With
  // the encoder loss on (and no router aux loss) the clean pass's first positions give the prompt's
  // K/V, and no pass runs over the prompt alone (docs/training.md, "Encoder loss").
  std::vector<Pass> passes;
  if (!shape.encoderLoss || shape.routerAuxLoss) passes.push_back({prompt, prompt, 0, false, true, true});
  if (shape.selfConditioning) passes.push_back({canvas, prompt + canvas, canvas, true, false});
  passes.push_back({canvas, prompt + canvas, canvas, true, true});
  if (shape.encoderLoss) passes.push_back({prompt + canvas, prompt + canvas, canvas, false, true});

  CostPrediction prediction;
  const ParameterShard shard = parameterShard(config, splits);
  prediction.parameterBytes = uint64_t(shard.parameters * f32);
  prediction.gradientBytes = uint64_t((shard.trainableDense + shard.trainableExperts) * f32);
  const double optimizerElements = shape.distributedOptimizer
                                       ? shard.trainableDense / double(splits.dp) + shard.trainableExperts / double(splits.edp)
                                       : shard.trainableDense + shard.trainableExperts;
  prediction.optimizerBytes = uint64_t(2 * optimizerElements * f32);

  // Activations: the arena's peak is the larger of two moments (docs/parallelism.md, "Layout
  // search"). At the turn from forward to backward it holds what every pass with a backward keeps
  // under the recompute policy, the embeddings and the f32 logits of the cross-entropies, and
  // pass 1's self-conditioning signal. At the end of the backward it holds the f32 weight gradient
  // of every trainable parameter (accumulated into grad/ only after the last one), the tied
  // embedding's three gradient contributions, and what the prompt's K/V pass keeps, whose
  // backward runs last. With bf16 compute both hold the bf16 copies of the parameters the
  // backward reads.
  auto keptBy = [&](const Pass& pass, double& largestLayer) {
    double kept = 0;
    for (int64_t layer = 0; layer < pass.wholeLayers(config); ++layer) {
      const LayerActivations bytes = layerActivations(config, layer, pass, shape.microBatch, splits, activation);
      largestLayer = std::max(largestLayer, bytes.total());
      switch (candidate.recompute) {
        case RecomputePolicy::None: kept += bytes.total(); break;
        case RecomputePolicy::Selective: kept += bytes.layerInput + bytes.matmulOutputs; break;
        case RecomputePolicy::Full: kept += bytes.layerInput; break;
      }
    }
    return kept + 2 * double(shape.microBatch * pass.length) * double(config.hiddenSize) * activation;  // embedding, scaled
  };
  const double vocabShard = double(config.paddedVocabSize) / double(splits.tp);
  double turn = 0, end = 0, largestLayer = 0;
  for (const Pass& pass : passes) {
    if (!pass.backward) continue;
    const double kept = keptBy(pass, largestLayer);
    turn += kept + 2 * double(shape.microBatch * pass.scored) * vocabShard * f32;
    if (pass.keyValuesOnly) end += kept;
  }
  turn += double(shape.microBatch * canvas) * (double(config.hiddenSize) + vocabShard) * activation;
  end += double(prediction.gradientBytes) + 3 * vocabShard * double(config.hiddenSize) * f32;
  // Recomputing a layer rebuilds its whole inventory once during the backward.
  const double recomputed = candidate.recompute != RecomputePolicy::None ? largestLayer : 0;
  const double parameterCopies = shape.bf16 ? shard.parameters * activation : 0;
  prediction.activationBytes = uint64_t(parameterCopies + recomputed + std::max(turn, end));

  // FLOPs: a backward costs twice its forward; recomputation re-runs forwards (selective: the
  // attention core and the experts).
  double tensorParallelBytes = 0, expertBytes = 0;
  for (const Pass& pass : passes) {
    const PassFlops flops = passFlops(config, pass, shape.microBatch, splits);
    const double directions = pass.backward ? 3 : 1;
    const double forward = flops.layers + flops.attentionCoreWindowed + flops.experts + flops.head;
    prediction.flops += directions * forward;
    prediction.flopsBound += directions * (flops.layers + flops.attentionCore + flops.expertsBound + flops.head);
    if (pass.backward && candidate.recompute == RecomputePolicy::Full) {
      prediction.flops += flops.layers + flops.attentionCoreWindowed + flops.experts;
      prediction.flopsBound += flops.layers + flops.attentionCore + flops.expertsBound;
    }
    if (pass.backward && candidate.recompute == RecomputePolicy::Selective) {
      prediction.flops += flops.attentionCoreWindowed + flops.experts;
      prediction.flopsBound += flops.attentionCore + flops.expertsBound;
    }
    // A block of the experts (EP's all-gather form) gets no pre-activations from its forward: its
    // backward computes the gate and up products again, 4 of the forward's 6 multiply-adds per route.
    if (pass.backward && splits.ep > 1) {
      prediction.flops += flops.experts * 2 / 3;
      prediction.flopsBound += flops.expertsBound * 2 / 3;
    }
    // Full recomputation re-runs each layer's forward collectives in the backward.
    const PassCommunication bytes = passCommunication(config, pass, shape.microBatch, splits, activation);
    const double forwards = pass.backward && candidate.recompute == RecomputePolicy::Full ? 2 : 1;
    tensorParallelBytes += (forwards + (pass.backward ? 1 : 0)) * bytes.tensorParallel;
    expertBytes += forwards * bytes.expertsForward + (pass.backward ? bytes.expertsBackward : 0);
  }
  // The self-conditioning product (probabilities [L, V/TP] x E shard) and its MLP, replicated.
  if (shape.selfConditioning) {
    const double rows = double(shape.microBatch * canvas), hidden = double(config.hiddenSize);
    const double product = 2 * rows * double(config.vocabSize) / double(splits.tp) * hidden;
    const double mlp = 2 * rows * hidden * 3 * double(config.intermediateSize);
    prediction.flops += product + 3 * mlp;
    prediction.flopsBound += product + 3 * mlp;
    tensorParallelBytes += 2 * ringShare(splits.tp) * rows * hidden * activation;
  }
  // AdamW: about a dozen FLOPs per element of the rank's optimizer shard.
  prediction.flops += 12 * optimizerElements;
  prediction.flopsBound += 12 * optimizerElements;

  // Gradients over each parameter's data-parallel replicas: an f32 reduce-scatter plus the updated
  // parameters' all-gather (ZeRO-1) receive the same bytes as an all-reduce.
  const double denseGradientBytes = 2 * ringShare(splits.dp) * shard.trainableDense * f32;
  const double expertGradientBytes = 2 * ringShare(splits.edp) * shard.trainableExperts * f32;

  prediction.communicationBytes = tensorParallelBytes + expertBytes + denseGradientBytes + expertGradientBytes;


  // Time: the GEMMs at the sustained FLOP rate or the HBM traffic (parameters read by every forward
  // and twice by every backward, gradients and optimizer state read and written once, activations
  // written and read once), whichever is longer; then the collectives, not overlapped.
  const double peakFlops = shape.bf16 ? accelerator.denseBf16Flops : accelerator.denseFp32Flops;
  const double computeSeconds = prediction.flops / (peakFlops * accelerator.computeEfficiency);
  const double parameterReads = shard.parameters * activation * (3.0 * double(passes.size()));
  const double stateTraffic = 2.0 * double(prediction.gradientBytes + prediction.optimizerBytes) + 2.0 * double(prediction.parameterBytes);
  const double memorySeconds =
      (parameterReads + stateTraffic + 2.0 * double(prediction.activationBytes)) / (accelerator.memoryBytesPerSecond * accelerator.linkEfficiency);
  prediction.computeSeconds = std::max(computeSeconds, memorySeconds);
  // The expert gathers of the compiled all-gather form span the data-parallel group, so the world.
  const int64_t worldSpan = candidate.layout.worldSize(), tensorSpan = splits.tp,
                expertSpan = splits.expertGather > 1 ? worldSpan : 1;
  prediction.communicationSeconds = tensorParallelBytes / bandwidth(accelerator, tensorSpan) +
                                    expertBytes / bandwidth(accelerator, expertSpan) +
                                    (denseGradientBytes + expertGradientBytes) / bandwidth(accelerator, worldSpan);
  prediction.tokensPerStep = shape.microBatch * splits.dp * (prompt + canvas);
  return prediction;
}

}  // namespace dgemma
