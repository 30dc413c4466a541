#include "models/diffusion_gemma/ir/Objective.h"

#include <algorithm>
#include <optional>

#include "models/diffusion_gemma/ir/VisionTower.h"
#include "models/diffusion_gemma/spec/Interface.h"

namespace mlir::dg::diffusion_gemma {

using namespace ::dgemma::diffusion_gemma;

ObjectiveBuilder::ObjectiveBuilder(GraphBuilder& graph, TextStack& text, const DiffusionGemmaObjective& objective)
    : g_(graph), text_(text), objective_(objective), b_(graph.builder()), config_(graph.config()),
      batch_(graph.batch()), canvasLength_(graph.config().canvasLength), hidden_(graph.config().hiddenSize),
      f32_(graph.f32()) {}

// Per-position cross-entropy of logits [..., V] against ids [...]; an optional bonus is added to
// the logit of bonusIds (the leave-one-out correction). Uncapped logits get the soft-cap inside
// the op, so the capped [..., V] tensor is never materialised.
Value ObjectiveBuilder::crossEntropy(Value logits, Value targets, Value bonusIds, Value bonus, const std::string& name, bool capped) {
  const double softcap = capped ? 0.0 : std::max(config_.finalLogitSoftcapping, 0.0);
  return b_.create<CrossEntropyOp>(g_.loc(name), logits, targets, bonusIds, bonus, b_.getF64FloatAttr(softcap));
}

// Uniform [0, 1) draws, each row of `shape` from its own example's key.
Value ObjectiveBuilder::uniform(Value keys, int64_t stream, ArrayRef<int64_t> shape, const std::string& name) {
  return b_.create<RandomUniformOp>(g_.loc(name), g_.f32Type(shape), keys, b_.getI64IntegerAttr(stream));
}

void ObjectiveBuilder::buildTrainStep(int64_t promptLength, int64_t imagesPerExample) {
  buildStep(promptLength, imagesPerExample, StepOutputs::Objective);
}

void ObjectiveBuilder::buildLogps(int64_t promptLength, int64_t imagesPerExample) {
  buildStep(promptLength, imagesPerExample, StepOutputs::LogpsOnly);
}

// The "train_step" and "logps" entries (Builder.h; docs/training.md, "The objective"; docs/rl.md).
void ObjectiveBuilder::buildStep(int64_t promptLength, int64_t imagesPerExample, StepOutputs outputs) {
  using Variant = DiffusionGemmaObjective::Variant;
  Value inputIds = g_.input(kInputIds, {batch_, promptLength}, b_.getI64Type());
  Value attentionMask = g_.input(kAttentionMask, {batch_, promptLength}, b_.getI64Type());
  Value canvasIds = g_.input(kCanvasIds, {batch_, canvasLength_}, b_.getI64Type());
  Value canvasMask = g_.input(kCanvasMask, {batch_, canvasLength_}, f32_);
  Value noisyIds = g_.input(kNoisyCanvasIds, {batch_, canvasLength_}, b_.getI64Type());
  Value diffusionTime = g_.input(kDiffusionTime, {batch_}, f32_);
  Value selfConditioningMask = g_.input(kSelfConditioningMask, {batch_}, f32_);
  std::vector<Value> auxTerms;
  const bool withLoss = outputs == StepOutputs::Objective;
  std::vector<Value>* pass2AuxTerms = withLoss && objective_.routerAuxLossCoeff > 0 ? &auxTerms : nullptr;
  text_.recordLoadBalancingLosses(pass2AuxTerms);

  // With images the vision tower runs once: its features enter the K/V pass and the clean pass.
  std::optional<VisionTower> vision;
  ImageInputs images;
  Value features;
  if (imagesPerExample > 0) {
    vision.emplace(g_, imagesPerExample);
    images = vision->declareInputs(promptLength);
    features = vision->features(images);
  }

  Value promptValid = g_.castTo(attentionMask, b_.getI1Type(), "attention_mask");

  // docs/training.md, "Encoder loss": a separate causal pass over prompt ⊕ clean target; it returns
  // the last hidden state and, if asked, every layer's K/V over all P + L positions.
  auto cleanPass = [&](std::vector<LayerKeyValues>* keyValuesOut) {
    Value cleanIds = g_.concat({inputIds, canvasIds}, 1, "clean.ids");
    Value canvasValid = g_.compare(canvasMask, g_.scalar(0.0, "clean.zero"), ComparePredicate::Gt, "clean.canvas_valid");
    Value cleanValid = g_.concat({promptValid, canvasValid}, 1, "clean.key_valid");
    Value cleanPositions = g_.positions(0, promptLength + canvasLength_);
    if (!vision) return text_.encoderStack(cleanIds, cleanValid, cleanPositions, keyValuesOut);
    // The clean target holds no image token: its positions read no feature row (N·T) and belong to
    // no image run (segment 0).
    auto indexType = RankedTensorType::get({batch_, canvasLength_}, b_.getI64Type());
    auto targetConstant = [&](int64_t value, const std::string& name) -> Value {
      return b_.create<ConstantOp>(g_.loc(name), DenseElementsAttr::get(indexType, value));
    };
    Value cleanIndex = g_.concat({images.tokenIndex, targetConstant(vision->pooledRows(), "clean.no_feature")}, 1,
                                 "clean.image_token_index");
    Value cleanSegments = vision->overlaySegmentIds(images.segmentIds);
    if (cleanSegments)
      cleanSegments = g_.concat({cleanSegments, targetConstant(0, "clean.no_image")}, 1, "clean.image_segment_ids");
    return text_.encoderStackOverEmbeddings(vision->mergedEmbedding(text_, cleanIds, features, cleanIndex), cleanValid,
                                            cleanPositions, keyValuesOut, cleanSegments);
  };

  // The prompt's K/V. Pass 1 would compute exactly the same values, so both passes read them; pass
  // 1's gradient is cut below, so the encoder gets gradient from pass 2 only.
  // The encoder is causal, so the clean pass's first P positions see only the prompt and hold
  // exactly the values of a K/V pass over the prompt alone (docs/training.md, "Encoder loss"). With
  // the encoder loss on, the decoders read those positions of the clean pass's K/V, and the stack
  // runs four times per micro-batch instead of five. The router's load-balancing loss is the one
  // exception: it counts the K/V pass's routes as terms of their own, so with it on the K/V pass
  // stays separate.
  const bool cleanPassGivesPromptKeyValues = objective_.encoderLossWeight > 0 && objective_.routerAuxLossCoeff == 0;
  std::vector<LayerKeyValues> keyValues;
  Value cleanHidden;
  if (cleanPassGivesPromptKeyValues) {
    std::vector<LayerKeyValues> cleanKeyValues;
    cleanHidden = cleanPass(&cleanKeyValues);
    for (size_t layer = 0; layer < cleanKeyValues.size(); ++layer) {
      const std::string name = "clean.prompt_kv." + std::to_string(layer);
      keyValues.push_back({g_.slice(cleanKeyValues[layer].keys, 1, 0, promptLength, name + ".keys"),
                           g_.slice(cleanKeyValues[layer].values, 1, 0, promptLength, name + ".values")});
    }
  } else if (vision) {
    text_.encoderStackOverEmbeddings(vision->mergedEmbedding(text_, inputIds, features, images.tokenIndex), promptValid,
                                     g_.positions(0, promptLength), &keyValues, vision->overlaySegmentIds(images.segmentIds));
  } else {
    text_.encoderStack(inputIds, promptValid, g_.positions(0, promptLength), &keyValues);
  }

  // Pass 1 (docs/training.md, "Self-conditioning"): no self-conditioning signal, no gradient, run whenever p > 0.
  Value signal;
  if (objective_.selfConditioningProb > 0) {
    text_.recordLoadBalancingLosses(nullptr);
    Value pass1 = text_.decoderLogits(text_.decoderInput(noisyIds, Value()), promptValid, keyValues);
    text_.recordLoadBalancingLosses(pass2AuxTerms);
    Value detached = b_.create<StopGradientOp>(g_.loc("sc.pass1.detach"), pass1);
    signal = text_.selfConditioningSignal(detached, selfConditioningMask);
  } else {
    // An exactly zero signal, as HF feeds without self-conditioning logits; the MLP still runs so
    // that its parameters stay in the step (with zero gradients).
    signal = b_.create<FillOp>(g_.loc("sc.zero"), g_.activationType({batch_, canvasLength_, hidden_}), b_.getF64FloatAttr(0.0));
  }
  // Pass 2's logits reach only the cross-entropy, which applies the soft-cap itself.
  Value logits = text_.decoderLogits(text_.decoderInput(noisyIds, signal), promptValid, keyValues, /*capped=*/false);

  // docs/training.md, "The four objectives": ℓ_b = w(t_b) Σ_l M CE / max(Σ_l M, 1), CE on f (+ δ(t) on the observed noisy token for LOO).
  const bool leaveOneOut = objective_.variant == Variant::LooCe || objective_.variant == Variant::ReweightedLooCe;
  const bool reweighted = objective_.variant == Variant::ReweightedCe || objective_.variant == Variant::ReweightedLooCe;
  Value bonus;
  if (leaveOneOut) {
    // δ(t) = g_.log(1 + K α / (1 − α)) with α = 1 − t and 1 − α = t clamped to 1e-12.
    Value keep = g_.sub(g_.scalar(1.0, "loo.one"), diffusionTime, "loo.alpha");
    Value odds = g_.div(keep, g_.maximum(diffusionTime, g_.scalar(1e-12, "loo.clamp"), "loo.t"), "loo.odds");
    Value delta = g_.log(g_.add(g_.scalar(1.0, "loo.one"),
                                g_.mul(odds, g_.scalar(static_cast<double>(config_.vocabSize), "loo.k"), "loo.k_odds"),
                                "loo.ratio"),
                         "loo.delta");
    bonus = g_.mul(g_.reshape(delta, {batch_, 1}, "loo.delta.rows"), g_.ones({batch_, canvasLength_}, "loo.canvas"), "loo.bonus");
  }
  Value tokenLoss = crossEntropy(logits, canvasIds, leaveOneOut ? noisyIds : Value(), bonus, "decoder.ce", /*capped=*/false);
  Value maskedSum = g_.reduceSum(g_.mul(tokenLoss, canvasMask, "decoder.ce.masked"), {1}, "decoder.ce.sum");
  Value loss;
  if (!withLoss || objective_.policyLoss == DiffusionGemmaObjective::PolicyLoss::Grpo) {
    // docs/rl.md, "The log-probability estimate": logps_b = −w(t_b) Σ_l M CE = −ℓ_b max(Σ_l M, 1).
    Value weighted = reweighted ? g_.mul(maskedSum, exampleWeight(diffusionTime), "policy.weighted") : maskedSum;
    Value logps = b_.create<NegOp>(g_.loc(kLogps), weighted);
    if (!withLoss) {
      g_.output(kLogps, logps);
      return;
    }
    loss = policyLoss(logps);
  } else {
    Value tokenCount = g_.maximum(g_.reduceSum(canvasMask, {1}, "decoder.tokens"), g_.scalar(1.0, "decoder.tokens.min"),
                                  "decoder.tokens.clamped");
    Value perExample = g_.div(maskedSum, tokenCount, "decoder.example_loss");
    if (reweighted) perExample = g_.mul(perExample, exampleWeight(diffusionTime), "decoder.example_loss.weighted");
    const double examples = static_cast<double>(batch_);
    Value diffusionLoss =
        g_.div(g_.reduceSum(perExample, {0}, "decoder.sum"), g_.scalar(examples, "batch"), "diffusion_loss");
    g_.output(kDiffusionLoss, diffusionLoss);
    loss = g_.mul(diffusionLoss, g_.scalar(objective_.decoderLossWeight, "decoder.weight"), "decoder.weighted");
  }

  // The encoder loss: position j of the clean pass predicts token j + 1, scored only where that token
  // is a real target. Only the L scored positions reach the head.
  if (objective_.encoderLossWeight > 0) {
    Value hidden = cleanHidden ? cleanHidden : cleanPass(nullptr);
    Value scored = b_.create<SliceOp>(g_.loc("clean.scored"), g_.activationType({batch_, canvasLength_, hidden_}), hidden,
                                      b_.getI64IntegerAttr(1), b_.getI64IntegerAttr(promptLength - 1));
    Value cleanLoss = crossEntropy(text_.head(scored, /*capped=*/false), canvasIds, Value(), Value(), "clean.ce", /*capped=*/false);
    Value cleanSum = g_.reduceSum(g_.mul(cleanLoss, canvasMask, "clean.ce.masked"), {0, 1}, "clean.ce.sum");
    Value cleanCount = g_.maximum(g_.reduceSum(canvasMask, {0, 1}, "clean.tokens"), g_.scalar(1.0, "clean.tokens.min"),
                                  "clean.tokens.clamped");
    Value encoderLoss = g_.div(cleanSum, cleanCount, "encoder_loss");
    g_.output(kEncoderLoss, encoderLoss);
    loss = g_.add(loss, g_.mul(encoderLoss, g_.scalar(objective_.encoderLossWeight, "encoder.weight"), "encoder.weighted"), "loss.encoder");
  }
  if (!auxTerms.empty()) {
    Value aux = auxTerms.front();
    for (size_t i = 1; i < auxTerms.size(); ++i) aux = g_.add(aux, auxTerms[i], "aux.sum");
    loss = g_.add(loss, g_.mul(aux, g_.scalar(objective_.routerAuxLossCoeff, "aux.coeff"), "aux.weighted"), "loss.aux");
  }
  text_.recordLoadBalancingLosses(nullptr);
  g_.output(kLoss, loss);
}

// w = −α'/α = 1 / max(1 − t, 1e-12), no 1/K factor (docs/training.md, "The four objectives").
Value ObjectiveBuilder::exampleWeight(Value diffusionTime) {
  Value keep = g_.maximum(g_.sub(g_.scalar(1.0, "weight.one"), diffusionTime, "weight.alpha"),
                          g_.scalar(1e-12, "weight.clamp"), "weight.alpha.clamped");
  Value weight = g_.div(g_.scalar(1.0, "weight.one"), keep, "weight");
  if (objective_.weightClip)
    weight = g_.minimum(weight, g_.scalar(*objective_.weightClip, "weight.clip"), "weight.clipped");
  return weight;
}

// docs/rl.md, "The GRPO loss": −(1/B) Σ_b (min(r' A, clamp(r, 1 − ε, 1 + ε) A) − β k3(ref, logps)),
// with r' = min(r, δ) under the two-sided clip and r' = r without it.
// dg-autodiff has no rule for minimum and maximum, so the surrogate is written as the branch
// that min picks: a bounded branch, whose value is a constant in the policy, enters through a
// stop_gradient and is chosen by a 0/1 mask that carries no gradient.
Value ObjectiveBuilder::policyLoss(Value logps) {
  Value advantages = g_.input(kAdvantages, {batch_}, f32_);
  Value oldLogps = g_.input(kOldLogps, {batch_}, f32_);
  Value refLogps = objective_.klCoeff > 0 ? g_.input(kRefLogps, {batch_}, f32_) : Value();
  g_.output(kLogps, logps);

  Value ratio = b_.create<ExpOp>(g_.loc("grpo.ratio"), g_.sub(logps, oldLogps, "grpo.log_ratio"));
  Value detachedRatio = b_.create<StopGradientOp>(g_.loc("grpo.ratio.detach"), ratio);
  Value clampedRatio = g_.minimum(
      g_.maximum(detachedRatio, g_.scalar(1.0 - objective_.clipEpsilon, "grpo.ratio.low"), "grpo.ratio.floor"),
      g_.scalar(1.0 + objective_.clipEpsilon, "grpo.ratio.high"), "grpo.ratio.clamped");
  Value unclipped = g_.mul(ratio, advantages, "grpo.surrogate.unclipped");
  Value clippedBranch = g_.mul(clampedRatio, advantages, "grpo.surrogate.clipped");
  // 1 where the clipped branch is the strictly smaller one, so that min takes it.
  Value clipped =
      g_.castTo(g_.compare(clippedBranch, unclipped, ComparePredicate::Lt, "grpo.clipped.branch"), f32_, kClipped);
  if (objective_.clipDelta) {
    // With δ > 1 + ε, min(min(r, δ) A, clamp(r) A) differs from the one-sided form only where
    // A < 0 and r > δ: there both branches are constants and δ A is the smaller.
    Value bound = g_.scalar(*objective_.clipDelta, "grpo.delta");
    Value aboveBound = g_.compare(detachedRatio, bound, ComparePredicate::Gt, "grpo.delta.above");
    Value negative = g_.compare(advantages, g_.scalar(0.0, "grpo.zero"), ComparePredicate::Lt, "grpo.delta.negative");
    Value aboveMask = g_.castTo(aboveBound, f32_, "grpo.delta.above.mask");
    Value negativeMask = g_.castTo(negative, f32_, "grpo.delta.negative.mask");
    Value capped = g_.mul(aboveMask, negativeMask, "grpo.delta.capped");
    Value takeCapped = g_.compare(capped, g_.scalar(0.0, "grpo.zero"), ComparePredicate::Gt, "grpo.delta.taken");
    Value cappedBranch = g_.mul(advantages, bound, "grpo.surrogate.capped");
    clippedBranch = b_.create<SelectOp>(g_.loc("grpo.surrogate.bounded"), takeCapped, cappedBranch, clippedBranch);
    clipped = g_.maximum(clipped, capped, "grpo.clipped.any");
  }
  g_.output(kClipped, clipped);
  Value unclippedShare = g_.sub(g_.scalar(1.0, "grpo.one"), clipped, "grpo.unclipped.mask");
  Value surrogate = g_.add(g_.mul(unclipped, unclippedShare, "grpo.surrogate.unclipped.taken"),
                           g_.mul(clippedBranch, clipped, "grpo.surrogate.clipped.taken"), "grpo.surrogate");
  Value objective = surrogate;
  if (refLogps) {
    // k3 = e^d − d − 1 with d = ref − logps: non-negative, zero where the policies agree.
    Value logRatio = g_.sub(refLogps, logps, "grpo.kl.log_ratio");
    Value kl = g_.sub(g_.sub(b_.create<ExpOp>(g_.loc("grpo.kl.ratio"), logRatio), logRatio, "grpo.kl.shifted"),
                      g_.scalar(1.0, "grpo.one"), kKlTerm);
    g_.output(kKlTerm, kl);
    objective = g_.sub(surrogate, g_.mul(kl, g_.scalar(objective_.klCoeff, "grpo.kl.coeff"), "grpo.kl.weighted"),
                       "grpo.objective");
  }
  return g_.div(g_.reduceSum(objective, {0}, "grpo.sum"), g_.scalar(-static_cast<double>(batch_), "grpo.batch"),
                "grpo.loss");
}

// The "corrupt" entry (Builder.h; docs/training.md, "Uniform-state corruption", "Self-conditioning", "Noise keys").
void ObjectiveBuilder::buildCorrupt() {
  Value keys = g_.input(kNoiseKeys, {batch_, 2}, b_.getI64Type());
  Value canvasIds = g_.input(kCanvasIds, {batch_, canvasLength_}, b_.getI64Type());
  Value canvasMask = g_.input(kCanvasMask, {batch_, canvasLength_}, f32_);

  Value level = uniform(keys, kTimeStream, {batch_}, "noise.t.uniform");
  Value diffusionTime = g_.add(g_.mul(level, g_.scalar(objective_.noiseMax - objective_.noiseMin, "noise.range"), "noise.t.scaled"),
                               g_.scalar(objective_.noiseMin, "noise.min"), "diffusion_t");
  Value selection = uniform(keys, kSelectionStream, {batch_, canvasLength_}, "noise.u");
  auto idsType = RankedTensorType::get({batch_, canvasLength_}, b_.getI64Type());
  Value replacement = b_.create<RandomIntOp>(g_.loc("noise.r"), idsType, keys, b_.getI64IntegerAttr(kReplacementStream),
                                             b_.getI64IntegerAttr(config_.vocabSize));
  // Only real canvas tokens are ever replaced: u < t and M = 1 (the replacement may equal the original).
  Value selected = g_.compare(selection, g_.reshape(diffusionTime, {batch_, 1}, "noise.t.rows"), ComparePredicate::Lt, "noise.selected");
  Value real = g_.compare(canvasMask, g_.scalar(0.0, "noise.zero"), ComparePredicate::Gt, "noise.real");
  Value replaced = b_.create<SelectOp>(g_.loc("noise.replaced"), real, replacement, canvasIds);
  Value noisy = b_.create<SelectOp>(g_.loc("noisy_canvas_ids"), selected, replaced, canvasIds);

  Value selfConditioningMask;
  if (objective_.selfConditioningProb > 0) {
    Value coin = uniform(keys, kSelfConditioningStream, {batch_}, "sc.coin");
    Value chosen = g_.compare(coin, g_.scalar(objective_.selfConditioningProb, "sc.prob"), ComparePredicate::Lt, "sc.chosen");
    selfConditioningMask = g_.castTo(chosen, f32_, "self_conditioning_mask");
  } else {
    selfConditioningMask = b_.create<FillOp>(g_.loc("self_conditioning_mask"), g_.f32Type({batch_}), b_.getF64FloatAttr(0.0));
  }
  g_.output(kDiffusionTime, diffusionTime);
  g_.output(kNoisyCanvasIds, noisy);
  g_.output(kSelfConditioningMask, selfConditioningMask);
}

}  // namespace mlir::dg::diffusion_gemma
