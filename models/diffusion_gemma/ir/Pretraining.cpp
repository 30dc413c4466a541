#include "models/diffusion_gemma/ir/Pretraining.h"

#include <algorithm>

#include "models/diffusion_gemma/spec/Interface.h"

namespace mlir::dg::diffusion_gemma {

using namespace ::dgemma::diffusion_gemma;

PretrainingBuilder::PretrainingBuilder(GraphBuilder& graph, TextStack& text,
                                       const DiffusionGemmaPretrainingObjective& objective)
    : g_(graph),
      text_(text),
      objective_(objective),
      b_(graph.builder()),
      config_(graph.config()),
      batch_(graph.batch()),
      f32_(graph.f32()) {}

void PretrainingBuilder::buildTrainStep(int64_t sequenceLength) {
  using Kind = DiffusionGemmaPretrainingObjective::Kind;
  Value inputIds = g_.input(kInputIds, {batch_, sequenceLength}, b_.getI64Type());
  Value positions = g_.input(kPositionIds, {batch_, sequenceLength}, b_.getI64Type());
  Value documentIds = g_.input(kDocumentIds, {batch_, sequenceLength}, b_.getI64Type());
  std::vector<Value> auxTerms;
  text_.recordLoadBalancingLosses(objective_.routerAuxLossCoeff > 0 ? &auxTerms : nullptr);
  Value loss;
  switch (objective_.kind) {
    case Kind::Autoregressive: loss = autoregressiveLoss(inputIds, positions, documentIds, sequenceLength); break;
    case Kind::MaskedDiffusion: loss = maskedDiffusionLoss(inputIds, positions, documentIds, sequenceLength); break;
    case Kind::BlockDiffusion: loss = blockDiffusionLoss(inputIds, positions, documentIds, sequenceLength); break;
  }
  text_.recordLoadBalancingLosses(nullptr);
  if (!auxTerms.empty()) {
    Value aux = auxTerms.front();
    for (size_t i = 1; i < auxTerms.size(); ++i) aux = g_.add(aux, auxTerms[i], "aux.sum");
    loss = g_.add(loss, g_.mul(aux, g_.scalar(objective_.routerAuxLossCoeff, "aux.coeff"), "aux.weighted"), "loss.aux");
  }
  g_.output(kLoss, loss);
}

void PretrainingBuilder::buildLogits(int64_t sequenceLength) {
  using Kind = DiffusionGemmaPretrainingObjective::Kind;
  Value inputIds = g_.input(kInputIds, {batch_, sequenceLength}, b_.getI64Type());
  Value positions = g_.input(kPositionIds, {batch_, sequenceLength}, b_.getI64Type());
  Value documentIds = g_.input(kDocumentIds, {batch_, sequenceLength}, b_.getI64Type());
  Value hidden = objective_.kind == Kind::Autoregressive
                     ? autoregressiveHidden(inputIds, positions, documentIds, sequenceLength)
                     : maskedDiffusionHidden(inputIds, g_.input(kLossMask, {batch_, sequenceLength}, f32_), positions,
                                             documentIds);
  g_.output(kLogits, text_.head(hidden, /*capped=*/true));
}

Value PretrainingBuilder::autoregressiveHidden(Value inputIds, Value positions, Value documentIds,
                                               int64_t sequenceLength) {
  Value keyValid = g_.constantBool({batch_, sequenceLength}, true, "ar.key_valid");
  return text_.packedStack(inputIds, keyValid, positions, documentIds, AttentionMask::Causal);
}

Value PretrainingBuilder::maskedDiffusionHidden(Value inputIds, Value lossMask, Value positions, Value documentIds) {
  Value keyValid = g_.compare(lossMask, g_.scalar(0.0, "md.zero"), ComparePredicate::Gt, "md.key_valid");
  return text_.packedStack(inputIds, keyValid, positions, documentIds, AttentionMask::Bidirectional);
}

Value PretrainingBuilder::normalisedCrossEntropy(Value hidden, Value targets, Value weights, Value countedTokens,
                                                 const std::string& name) {
  const double softcap = std::max(config_.finalLogitSoftcapping, 0.0);
  Value tokenLoss = b_.create<CrossEntropyOp>(g_.loc(name + ".ce"), text_.head(hidden, /*capped=*/false), targets,
                                              Value(), Value(), b_.getF64FloatAttr(softcap));
  Value weighted = g_.reduceSum(g_.mul(tokenLoss, weights, name + ".ce.weighted"), {0, 1}, name + ".ce.sum");
  Value count = g_.maximum(g_.reduceSum(countedTokens, {0, 1}, name + ".tokens"), g_.scalar(1.0, name + ".tokens.min"),
                           name + ".tokens.clamped");
  return g_.div(weighted, count, name + ".loss");
}

// Next-token prediction inside each document: the causal mask, every key valid (padding is a
// document of its own, so no real token sees it), and the labels scored where loss_mask is 1.
Value PretrainingBuilder::autoregressiveLoss(Value inputIds, Value positions, Value documentIds,
                                             int64_t sequenceLength) {
  Value labels = g_.input(kLabels, {batch_, sequenceLength}, b_.getI64Type());
  Value lossMask = g_.input(kLossMask, {batch_, sequenceLength}, f32_);
  Value hidden = autoregressiveHidden(inputIds, positions, documentIds, sequenceLength);
  return normalisedCrossEntropy(hidden, labels, lossMask, lossMask, "ar");
}

// MDLM/LLaDA's absorbing-state objective (docs/pretraining.md, "Masked diffusion").
Value PretrainingBuilder::maskedDiffusionLoss(Value inputIds, Value positions, Value documentIds,
                                              int64_t sequenceLength) {
  Value lossMask = g_.input(kLossMask, {batch_, sequenceLength}, f32_);
  Value keys = g_.input(kNoiseKeys, {batch_, 2}, b_.getI64Type());
  const SmallVector<int64_t> tokens{batch_, sequenceLength};

  // p_mask = (1 − ε) t + ε with t ~ U(0, 1) from each row's key.
  Value time =
      b_.create<RandomUniformOp>(g_.loc("md.t"), g_.f32Type({batch_}), keys, b_.getI64IntegerAttr(kTimeStream));
  const double epsilon = objective_.maskEpsilon;
  Value maskProbability = g_.add(g_.mul(time, g_.scalar(1.0 - epsilon, "md.one_minus_eps"), "md.t.scaled"),
                                 g_.scalar(epsilon, "md.eps"), kMaskProbability);
  Value rowProbability = g_.reshape(maskProbability, {batch_, 1}, "md.p_mask.rows");

  // Each real token is masked when its uniform is below p_mask.
  Value draws = b_.create<RandomUniformOp>(g_.loc("md.u"), g_.f32Type(tokens), keys, b_.getI64IntegerAttr(kMaskStream));
  Value real =
      g_.castTo(g_.compare(lossMask, g_.scalar(0.0, "md.zero"), ComparePredicate::Gt, "md.real"), f32_, "md.real.f32");
  Value drawn =
      g_.mul(g_.castTo(g_.compare(draws, rowProbability, ComparePredicate::Lt, "md.below"), f32_, "md.below.f32"), real,
             "md.drawn");
  // At least one masked token per row with a real token: where the draw masked none, the real token
  // with the smallest uniform. Padding's uniforms are pushed above every real one (2 > 1) first.
  Value realDraws = g_.add(draws,
                           g_.mul(g_.sub(g_.scalar(1.0, "md.one"), real, "md.padding"),
                                  g_.scalar(2.0, "md.padding.offset"), "md.padding.shift"),
                           "md.real_draws");
  Value negated = b_.create<NegOp>(g_.loc("md.real_draws.neg"), realDraws);
  Value largest = b_.create<ReduceMaxOp>(g_.loc("md.smallest.neg"), g_.f32Type({batch_, 1}), negated,
                                         b_.getDenseI64ArrayAttr({1}), b_.getBoolAttr(true));
  Value smallest =
      g_.mul(g_.castTo(g_.compare(negated, largest, ComparePredicate::Eq, "md.smallest"), f32_, "md.smallest.f32"),
             real, "md.smallest.real");
  Value noneDrawn = g_.castTo(g_.compare(g_.reduceSum(drawn, {1}, "md.drawn.count"), g_.scalar(0.0, "md.zero"),
                                         ComparePredicate::Eq, "md.none"),
                              f32_, "md.none.f32");
  Value masked = g_.maximum(drawn, g_.mul(smallest, g_.reshape(noneDrawn, {batch_, 1}, "md.none.rows"), "md.fallback"),
                            kMaskedPositions);
  Value maskIds = b_.create<ConstantOp>(
      g_.loc("md.mask_token"),
      DenseElementsAttr::get(RankedTensorType::get(tokens, b_.getI64Type()), objective_.maskTokenId));
  Value isMasked = g_.compare(masked, g_.scalar(0.0, "md.zero"), ComparePredicate::Gt, "md.is_masked");
  Value noisyIds = b_.create<SelectOp>(g_.loc(kMaskedInputIds), isMasked, maskIds, inputIds);
  g_.output(kMaskProbability, maskProbability);
  g_.output(kMaskedInputIds, noisyIds);
  g_.output(kMaskedPositions, masked);

  // The bidirectional pass over the real tokens of each document; the masked tokens' CE weighted by 1 / p_mask.
  Value hidden = maskedDiffusionHidden(noisyIds, lossMask, positions, documentIds);
  Value weights = g_.div(masked, rowProbability, "md.weights");
  return normalisedCrossEntropy(hidden, inputIds, weights, lossMask, "md");
}

// The SFT recipe's uniform-state objective on packed text (docs/pretraining.md, "Block diffusion on
// packed text"): every block of L tokens is a canvas whose clean context is the row before it.
Value PretrainingBuilder::blockDiffusionLoss(Value inputIds, Value positions, Value documentIds,
                                             int64_t sequenceLength) {
  Value lossMask = g_.input(kLossMask, {batch_, sequenceLength}, f32_);
  Value keys = g_.input(kNoiseKeys, {batch_, 2}, b_.getI64Type());
  const int64_t blockLength = objective_.canvasLength, blocks = sequenceLength / blockLength;
  const SmallVector<int64_t> tokens{batch_, sequenceLength};

  // The SFT corruption (Objective.cpp, buildCorrupt) with one t per block: element k of the row's
  // stream-0 draws is block k's, so a one-block row draws exactly the SFT canvas's t.
  Value level = b_.create<RandomUniformOp>(g_.loc("bd.t.uniform"), g_.f32Type({batch_, blocks}), keys,
                                           b_.getI64IntegerAttr(kTimeStream));
  Value diffusionTime =
      g_.add(g_.mul(level, g_.scalar(objective_.noiseMax - objective_.noiseMin, "bd.noise.range"), "bd.t.scaled"),
             g_.scalar(objective_.noiseMin, "bd.noise.min"), kDiffusionTime);
  Value tokenTime = g_.reshape(g_.mul(g_.reshape(diffusionTime, {batch_, blocks, 1}, "bd.t.blocks"),
                                      g_.ones({batch_, blocks, blockLength}, "bd.block"), "bd.t.tokens"),
                               tokens, "bd.t.row");
  Value selection =
      b_.create<RandomUniformOp>(g_.loc("bd.u"), g_.f32Type(tokens), keys, b_.getI64IntegerAttr(kSelectionStream));
  Value replacement =
      b_.create<RandomIntOp>(g_.loc("bd.r"), RankedTensorType::get(tokens, b_.getI64Type()), keys,
                             b_.getI64IntegerAttr(kReplacementStream), b_.getI64IntegerAttr(config_.vocabSize));
  // Only real tokens are ever replaced: u < t and loss_mask = 1 (the replacement may equal the original).
  Value selected = g_.compare(selection, tokenTime, ComparePredicate::Lt, "bd.selected");
  Value real = g_.compare(lossMask, g_.scalar(0.0, "bd.zero"), ComparePredicate::Gt, "bd.real");
  Value replaced = b_.create<SelectOp>(g_.loc("bd.replaced"), real, replacement, inputIds);
  Value noisyIds = b_.create<SelectOp>(g_.loc(kNoisyCanvasIds), selected, replaced, inputIds);
  g_.output(kDiffusionTime, diffusionTime);
  g_.output(kNoisyCanvasIds, noisyIds);

  // The encoder pass: causal over the clean row within each document (padding is a document of its
  // own, so every key is valid); only its K/V are read.
  std::vector<LayerKeyValues> clean;
  text_.packedStack(inputIds, g_.constantBool(tokens, true, "bd.clean.key_valid"), positions, documentIds,
                    AttentionMask::Causal, &clean);

  // One decoder call per block over [clean K/V of the positions before it ; the noisy block]: a single
  // call over the whole row would need each block to see only its own noisy keys besides the clean
  // prefix, which no mask of dg.attention expresses (docs/pretraining.md, "Block diffusion on packed text").
  Value decoderInput = text_.decoderInput(noisyIds, Value());
  std::vector<Value> blockHidden;
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t start = block * blockLength;
    const std::string name = "bd.block." + std::to_string(block);
    std::vector<LayerKeyValues> prefix;
    for (size_t layer = 0; layer < clean.size() && start > 0; ++layer)
      prefix.push_back({g_.slice(clean[layer].keys, 1, 0, start, name + ".prefix_k." + std::to_string(layer)),
                        g_.slice(clean[layer].values, 1, 0, start, name + ".prefix_v." + std::to_string(layer))});
    blockHidden.push_back(text_.packedDecoderBlock(
        g_.slice(decoderInput, 1, start, blockLength, name + ".input"),
        g_.slice(positions, 1, start, blockLength, name + ".positions"), start > 0 ? &prefix : nullptr,
        g_.slice(documentIds, 1, 0, start + blockLength, name + ".document_ids")));
  }
  Value hidden = blocks == 1 ? blockHidden.front() : g_.concat(blockHidden, 1, "bd.hidden");

  // The SFT normalisation per block (base-sft): ℓ_{b,k} = Σ loss_mask·CE / max(Σ loss_mask, 1), averaged
  // over the blocks that hold a real token.
  const double softcap = std::max(config_.finalLogitSoftcapping, 0.0);
  Value tokenLoss = b_.create<CrossEntropyOp>(g_.loc("bd.ce"), text_.head(hidden, /*capped=*/false), inputIds, Value(),
                                              Value(), b_.getF64FloatAttr(softcap));
  const SmallVector<int64_t> blockShape{batch_, blocks, blockLength};
  Value blockSum =
      g_.reduceSum(g_.reshape(g_.mul(tokenLoss, lossMask, "bd.ce.real"), blockShape, "bd.ce.blocks"), {2}, "bd.ce.sum");
  Value blockTokens = g_.reduceSum(g_.reshape(lossMask, blockShape, "bd.real.blocks"), {2}, "bd.tokens");
  Value blockLoss =
      g_.div(blockSum, g_.maximum(blockTokens, g_.scalar(1.0, "bd.tokens.min"), "bd.tokens.clamped"), "bd.block_loss");
  Value scoredBlocks = g_.castTo(g_.compare(blockTokens, g_.scalar(0.0, "bd.zero"), ComparePredicate::Gt, "bd.scored"),
                                 f32_, "bd.scored.f32");
  Value blockCount =
      g_.maximum(g_.reduceSum(scoredBlocks, {0, 1}, "bd.blocks"), g_.scalar(1.0, "bd.blocks.min"), "bd.blocks.clamped");
  return g_.div(g_.reduceSum(blockLoss, {0, 1}, "bd.loss.sum"), blockCount, "bd.loss");
}

}  // namespace mlir::dg::diffusion_gemma
