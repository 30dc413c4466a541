#include "models/diffusion_gemma/Builder.h"

#include <cmath>

#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::dg {

namespace {

using dgemma::DiffusionGemmaConfig;

// The K/V one encoder layer hands to the decoder layer of the same index.
struct LayerKeyValues {
  Value keys;    // [B, P, Hkv, D], after k_norm and RoPE
  Value values;  // [B, P, Hkv, D], after the weightless v_norm
};

// Where a layer's attention reads its keys from.
struct EncoderAttention {
  Value keyValid;  // [B, P] i1
};
struct DecoderAttention {
  Value keyValid;  // [B, P + L] i1: the prompt mask, then the (always valid) canvas
  const LayerKeyValues* prefix;
  int64_t prefixLength;
};

class ModelBuilder {
 public:
  ModelBuilder(OpBuilder& builder, const DiffusionGemmaConfig& config, int64_t batch, Precision precision)
      : b_(builder), config_(config), batch_(batch), canvasLength_(config.canvasLength), hidden_(config.hiddenSize),
        f32_(builder.getF32Type()),
        activation_(precision == Precision::Bf16 ? Type(builder.getBF16Type()) : Type(builder.getF32Type())) {}

  // The "forward" entry (Builder.h).
  void buildForward(int64_t promptLength) {
    Value inputIds = input("input_ids", {batch_, promptLength}, b_.getI64Type());
    Value attentionMask = input("attention_mask", {batch_, promptLength}, b_.getI64Type());
    Value canvasIds = input("noisy_canvas_ids", {batch_, canvasLength_}, b_.getI64Type());
    Value selfConditioningLogits = input("self_conditioning_logits", {batch_, canvasLength_, config_.vocabSize}, f32_);
    Value selfConditioningMask = input("self_conditioning_mask", {batch_}, f32_);

    Value promptValid = castTo(attentionMask, b_.getI1Type(), "attention_mask");
    std::vector<LayerKeyValues> keyValues;
    Value hidden = encoderStack(inputIds, promptValid, positions(0, promptLength), &keyValues);
    output("encoder_hidden", toF32(rmsNorm(hidden, param(top("norm.weight"), {hidden_}, "ones"), "encoder.norm"), "encoder_hidden"));
    for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer) {
      const std::string keyName = "encoder_k." + std::to_string(layer), valueName = "encoder_v." + std::to_string(layer);
      output(keyName, toF32(keyValues[layer].keys, keyName));
      output(valueName, toF32(keyValues[layer].values, valueName));
    }
    Value signal = selfConditioningSignal(selfConditioningLogits, selfConditioningMask);
    output("logits", decoderLogits(decoderInput(canvasIds, signal), promptValid, keyValues));
  }

  // The "train_step" entry (Builder.h; training.md §2, §5-§9).
  void buildTrainStep(int64_t promptLength, const DiffusionGemmaObjective& objective) {
    using Variant = DiffusionGemmaObjective::Variant;
    Value inputIds = input("input_ids", {batch_, promptLength}, b_.getI64Type());
    Value attentionMask = input("attention_mask", {batch_, promptLength}, b_.getI64Type());
    Value canvasIds = input("canvas_ids", {batch_, canvasLength_}, b_.getI64Type());
    Value canvasMask = input("canvas_mask", {batch_, canvasLength_}, f32_);
    Value noisyIds = input("noisy_canvas_ids", {batch_, canvasLength_}, b_.getI64Type());
    Value diffusionTime = input("diffusion_t", {batch_}, f32_);
    Value selfConditioningMask = input("self_conditioning_mask", {batch_}, f32_);
    std::vector<Value> auxTerms;
    auxTerms_ = objective.routerAuxLossCoeff > 0 ? &auxTerms : nullptr;

    // The prompt's K/V pass. Pass 1 would compute exactly the same values, so both passes read it;
    // pass 1's gradient is cut below, so the encoder gets gradient from pass 2 only.
    Value promptValid = castTo(attentionMask, b_.getI1Type(), "attention_mask");
    std::vector<LayerKeyValues> keyValues;
    encoderStack(inputIds, promptValid, positions(0, promptLength), &keyValues);

    // Pass 1 (§7): no self-conditioning signal, no gradient, run whenever p > 0.
    Value signal;
    if (objective.selfConditioningProb > 0) {
      std::vector<Value>* pass2AuxTerms = auxTerms_;
      auxTerms_ = nullptr;
      Value pass1 = decoderLogits(decoderInput(noisyIds, Value()), promptValid, keyValues);
      auxTerms_ = pass2AuxTerms;
      Value detached = b_.create<StopGradientOp>(loc("sc.pass1.detach"), pass1.getType(), pass1);
      signal = selfConditioningSignal(detached, selfConditioningMask);
    } else {
      // An exactly zero signal, as HF feeds without self-conditioning logits; the MLP still runs so
      // that its parameters stay in the step (with zero gradients).
      signal = b_.create<FillOp>(loc("sc.zero"), activationType({batch_, canvasLength_, hidden_}), b_.getF64FloatAttr(0.0));
    }
    // Pass 2's logits reach only the cross-entropy, which applies the soft-cap itself.
    Value logits = decoderLogits(decoderInput(noisyIds, signal), promptValid, keyValues, /*capped=*/false);

    // §5: ℓ_b = w(t_b) Σ_l M CE / max(Σ_l M, 1), CE on f (+ δ(t) on the observed noisy token for LOO).
    const bool leaveOneOut = objective.variant == Variant::LooCe || objective.variant == Variant::ReweightedLooCe;
    const bool reweighted = objective.variant == Variant::ReweightedCe || objective.variant == Variant::ReweightedLooCe;
    Value bonus;
    if (leaveOneOut) {
      // δ(t) = log(1 + K α / (1 − α)) with α = 1 − t and 1 − α = t clamped to 1e-12.
      Value keep = sub(scalar(1.0, "loo.one"), diffusionTime, "loo.alpha");
      Value odds = div(keep, maximum(diffusionTime, scalar(1e-12, "loo.clamp"), "loo.t"), "loo.odds");
      Value delta = log(add(scalar(1.0, "loo.one"), mul(odds, scalar(static_cast<double>(config_.vocabSize), "loo.k"), "loo.k_odds"),
                            "loo.ratio"),
                        "loo.delta");
      bonus = mul(reshape(delta, {batch_, 1}, "loo.delta.rows"), ones({batch_, canvasLength_}, "loo.canvas"), "loo.bonus");
    }
    Value tokenLoss = crossEntropy(logits, canvasIds, leaveOneOut ? noisyIds : Value(), bonus, "decoder.ce", /*capped=*/false);
    Value maskedSum = reduceSum(mul(tokenLoss, canvasMask, "decoder.ce.masked"), {1}, "decoder.ce.sum");
    Value tokenCount = maximum(reduceSum(canvasMask, {1}, "decoder.tokens"), scalar(1.0, "decoder.tokens.min"), "decoder.tokens.clamped");
    Value perExample = div(maskedSum, tokenCount, "decoder.example_loss");
    if (reweighted) {
      // w = −α'/α = 1 / max(1 − t, 1e-12), no 1/K factor (§5).
      Value keep = maximum(sub(scalar(1.0, "weight.one"), diffusionTime, "weight.alpha"), scalar(1e-12, "weight.clamp"), "weight.alpha.clamped");
      Value weight = div(scalar(1.0, "weight.one"), keep, "weight");
      if (objective.weightClip) weight = minimum(weight, scalar(*objective.weightClip, "weight.clip"), "weight.clipped");
      perExample = mul(perExample, weight, "decoder.example_loss.weighted");
    }
    const double examples = static_cast<double>(batch_);
    Value diffusionLoss = div(reduceSum(perExample, {0}, "decoder.sum"), scalar(examples, "batch"), "diffusion_loss");
    output("diffusion_loss", diffusionLoss);
    Value loss = mul(diffusionLoss, scalar(objective.decoderLossWeight, "decoder.weight"), "decoder.weighted");

    // §8: a separate causal pass over prompt ⊕ clean target; position j predicts token j + 1, scored
    // only where that token is a real target. Only the L scored positions reach the head.
    if (objective.encoderLossWeight > 0) {
      Value cleanIds = concat({inputIds, canvasIds}, 1, "clean.ids");
      Value canvasValid = compare(canvasMask, scalar(0.0, "clean.zero"), ComparePredicate::Gt, "clean.canvas_valid");
      Value cleanValid = concat({promptValid, canvasValid}, 1, "clean.key_valid");
      Value hidden = encoderStack(cleanIds, cleanValid, positions(0, promptLength + canvasLength_), nullptr);
      Value scored = b_.create<SliceOp>(loc("clean.scored"), activationType({batch_, canvasLength_, hidden_}), hidden,
                                        b_.getI64IntegerAttr(1), b_.getI64IntegerAttr(promptLength - 1));
      Value cleanLoss = crossEntropy(head(scored, /*capped=*/false), canvasIds, Value(), Value(), "clean.ce", /*capped=*/false);
      Value cleanSum = reduceSum(mul(cleanLoss, canvasMask, "clean.ce.masked"), {0, 1}, "clean.ce.sum");
      Value cleanCount = maximum(reduceSum(canvasMask, {0, 1}, "clean.tokens"), scalar(1.0, "clean.tokens.min"), "clean.tokens.clamped");
      Value encoderLoss = div(cleanSum, cleanCount, "encoder_loss");
      output("encoder_loss", encoderLoss);
      loss = add(loss, mul(encoderLoss, scalar(objective.encoderLossWeight, "encoder.weight"), "encoder.weighted"), "loss.encoder");
    }
    if (!auxTerms.empty()) {
      Value aux = auxTerms.front();
      for (size_t i = 1; i < auxTerms.size(); ++i) aux = add(aux, auxTerms[i], "aux.sum");
      loss = add(loss, mul(aux, scalar(objective.routerAuxLossCoeff, "aux.coeff"), "aux.weighted"), "loss.aux");
    }
    auxTerms_ = nullptr;
    output("loss", loss);
  }

  // The "corrupt" entry (Builder.h; training.md §4, §7, §11).
  void buildCorrupt(const DiffusionGemmaObjective& objective) {
    Value keys = input("noise_keys", {batch_, 2}, b_.getI64Type());
    Value canvasIds = input("canvas_ids", {batch_, canvasLength_}, b_.getI64Type());
    Value canvasMask = input("canvas_mask", {batch_, canvasLength_}, f32_);

    Value level = uniform(keys, kTimeStream, {batch_}, "noise.t.uniform");
    Value diffusionTime = add(mul(level, scalar(objective.noiseMax - objective.noiseMin, "noise.range"), "noise.t.scaled"),
                              scalar(objective.noiseMin, "noise.min"), "diffusion_t");
    Value selection = uniform(keys, kSelectionStream, {batch_, canvasLength_}, "noise.u");
    auto idsType = RankedTensorType::get({batch_, canvasLength_}, b_.getI64Type());
    Value replacement = b_.create<RandomIntOp>(loc("noise.r"), idsType, keys, b_.getI64IntegerAttr(kReplacementStream),
                                               b_.getI64IntegerAttr(config_.vocabSize));
    // Only real canvas tokens are ever replaced: u < t and M = 1 (the replacement may equal the original).
    Value selected = compare(selection, reshape(diffusionTime, {batch_, 1}, "noise.t.rows"), ComparePredicate::Lt, "noise.selected");
    Value real = compare(canvasMask, scalar(0.0, "noise.zero"), ComparePredicate::Gt, "noise.real");
    Value replaced = b_.create<SelectOp>(loc("noise.replaced"), idsType, real, replacement, canvasIds);
    Value noisy = b_.create<SelectOp>(loc("noisy_canvas_ids"), idsType, selected, replaced, canvasIds);

    Value selfConditioningMask;
    if (objective.selfConditioningProb > 0) {
      Value coin = uniform(keys, kSelfConditioningStream, {batch_}, "sc.coin");
      Value chosen = compare(coin, scalar(objective.selfConditioningProb, "sc.prob"), ComparePredicate::Lt, "sc.chosen");
      selfConditioningMask = castTo(chosen, f32_, "self_conditioning_mask");
    } else {
      selfConditioningMask = b_.create<FillOp>(loc("self_conditioning_mask"), f32Type({batch_}), b_.getF64FloatAttr(0.0));
    }
    output("diffusion_t", diffusionTime);
    output("noisy_canvas_ids", noisy);
    output("self_conditioning_mask", selfConditioningMask);
  }

 private:
  static constexpr int64_t kTimeStream = 0, kSelectionStream = 1, kReplacementStream = 2, kSelfConditioningStream = 3;

  // ---- naming and small helpers ----------------------------------------------------------------
  static std::string top(const std::string& suffix) { return "model.decoder." + suffix; }
  static std::string layerName(int64_t layer, const std::string& suffix) {
    return "model.decoder.layers." + std::to_string(layer) + "." + suffix;
  }
  Location loc(const std::string& name) { return NameLoc::get(b_.getStringAttr("diffusion_gemma." + name)); }
  RankedTensorType f32Type(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, f32_); }
  RankedTensorType activationType(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, activation_); }
  bool mixedPrecision() const { return activation_ != f32_; }
  static Type elementTypeOf(Value value) { return cast<RankedTensorType>(value.getType()).getElementType(); }
  static ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

  Value input(const std::string& name, ArrayRef<int64_t> shape, Type element) {
    return b_.create<InputOp>(loc(name), RankedTensorType::get(shape, element), b_.getStringAttr(name));
  }
  void output(const std::string& name, Value value) { b_.create<OutputOp>(loc(name), name, value); }

  // A parameter as the forward uses it: the f32 master (HF's initialisation: linear and embedding
  // weights N(0, 0.02); norm weights and scales 1), cast to the activation dtype at this use.
  Value param(const std::string& name, ArrayRef<int64_t> shape, StringRef init, bool trainable = true) {
    SmallVector<NamedAttribute> fields{b_.getNamedAttr("kind", b_.getStringAttr(init))};
    if (init == "normal") fields.push_back(b_.getNamedAttr("std", b_.getF64FloatAttr(0.02)));
    Value master = b_.create<ParamOp>(loc(name), f32Type(shape), b_.getStringAttr(name), b_.getDictionaryAttr(fields),
                                      b_.getBoolAttr(trainable));
    return mixedPrecision() ? castTo(master, activation_, name + ".bf16") : master;
  }
  // A parameter read by an fp32 island: the value the forward uses (bf16-rounded in mixed
  // precision, as every parameter is), widened to f32.
  Value islandParam(const std::string& name, ArrayRef<int64_t> shape, StringRef init) {
    return toF32(param(name, shape, init), name);
  }

  Value scalar(double value, const std::string& name, Type element = {}) {
    return b_.create<FillOp>(loc(name), RankedTensorType::get({}, element ? element : f32_), b_.getF64FloatAttr(value));
  }
  Value toF32(Value value, const std::string& name) { return convert(value, f32_, name + ".f32"); }
  Value toActivation(Value value, const std::string& name) { return convert(value, activation_, name + ".bf16"); }
  Value convert(Value value, Type element, const std::string& name) {
    return elementTypeOf(value) == element ? value : castTo(value, element, name);
  }

  Value ones(ArrayRef<int64_t> shape, const std::string& name) {
    return b_.create<FillOp>(loc(name), f32Type(shape), b_.getF64FloatAttr(1.0));
  }

  template <typename BinaryOp>
  Value binary(Value lhs, Value rhs, const std::string& name) {
    auto shape = *broadcastShapes(shapeOf(lhs), shapeOf(rhs));
    auto type = RankedTensorType::get(shape, cast<RankedTensorType>(lhs.getType()).getElementType());
    return b_.create<BinaryOp>(loc(name), type, lhs, rhs);
  }
  Value add(Value lhs, Value rhs, const std::string& name) { return binary<AddOp>(lhs, rhs, name); }
  Value sub(Value lhs, Value rhs, const std::string& name) { return binary<SubOp>(lhs, rhs, name); }
  Value mul(Value lhs, Value rhs, const std::string& name) { return binary<MulOp>(lhs, rhs, name); }
  Value div(Value lhs, Value rhs, const std::string& name) { return binary<DivOp>(lhs, rhs, name); }
  Value maximum(Value lhs, Value rhs, const std::string& name) { return binary<MaximumOp>(lhs, rhs, name); }
  Value minimum(Value lhs, Value rhs, const std::string& name) { return binary<MinimumOp>(lhs, rhs, name); }
  Value log(Value x, const std::string& name) { return b_.create<LogOp>(loc(name), x.getType(), x); }

  // i1 result of `lhs <predicate> rhs` (broadcasting).
  Value compare(Value lhs, Value rhs, ComparePredicate predicate, const std::string& name) {
    auto type = RankedTensorType::get(*broadcastShapes(shapeOf(lhs), shapeOf(rhs)), b_.getI1Type());
    return b_.create<CompareOp>(loc(name), type, lhs, rhs, ComparePredicateAttr::get(b_.getContext(), predicate));
  }

  Value reduceSum(Value x, ArrayRef<int64_t> dims, const std::string& name) {
    SmallVector<int64_t> shape;
    for (int64_t d = 0; d < static_cast<int64_t>(shapeOf(x).size()); ++d)
      if (!llvm::is_contained(dims, d)) shape.push_back(shapeOf(x)[d]);
    return b_.create<ReduceSumOp>(loc(name), f32Type(shape), x, b_.getDenseI64ArrayAttr(dims), b_.getBoolAttr(false));
  }

  // Per-position cross-entropy of logits [..., V] against ids [...]; an optional bonus is added to
  // the logit of bonusIds (the leave-one-out correction). Uncapped logits get the soft-cap inside
  // the op, so the capped [..., V] tensor is never materialised.
  Value crossEntropy(Value logits, Value targets, Value bonusIds, Value bonus, const std::string& name, bool capped) {
    const double softcap = capped ? 0.0 : std::max(config_.finalLogitSoftcapping, 0.0);
    return b_.create<CrossEntropyOp>(loc(name), f32Type(shapeOf(targets)), logits, targets, bonusIds, bonus,
                                     b_.getF64FloatAttr(softcap));
  }

  // Uniform [0, 1) draws, each row of `shape` from its own example's key.
  Value uniform(Value keys, int64_t stream, ArrayRef<int64_t> shape, const std::string& name) {
    return b_.create<RandomUniformOp>(loc(name), f32Type(shape), keys, b_.getI64IntegerAttr(stream));
  }

  Value reshape(Value value, ArrayRef<int64_t> shape, const std::string& name) {
    auto type = RankedTensorType::get(shape, cast<RankedTensorType>(value.getType()).getElementType());
    return b_.create<ReshapeOp>(loc(name), type, value);
  }
  Value castTo(Value value, Type element, const std::string& name) {
    return b_.create<CastOp>(loc(name), RankedTensorType::get(shapeOf(value), element), value);
  }
  Value concat(ArrayRef<Value> values, int64_t dim, const std::string& name) {
    SmallVector<int64_t> shape(shapeOf(values.front()));
    shape[dim] = 0;
    for (Value value : values) shape[dim] += shapeOf(value)[dim];
    auto type = RankedTensorType::get(shape, cast<RankedTensorType>(values.front().getType()).getElementType());
    return b_.create<ConcatOp>(loc(name), type, values, b_.getI64IntegerAttr(dim));
  }

  // Positions start..start+count-1 on every row: [B, count] i64.
  Value positions(int64_t start, int64_t count) {
    SmallVector<int64_t> values;
    for (int64_t row = 0; row < batch_; ++row)
      for (int64_t i = 0; i < count; ++i) values.push_back(start + i);
    auto type = RankedTensorType::get({batch_, count}, b_.getI64Type());
    return b_.create<ConstantOp>(loc("positions"), DenseElementsAttr::get(type, ArrayRef<int64_t>(values)));
  }
  Value constantBool(ArrayRef<int64_t> shape, bool value) {
    auto type = RankedTensorType::get(shape, b_.getI1Type());
    return b_.create<ConstantOp>(loc("canvas.key_valid"), DenseElementsAttr::get(type, value));
  }

  // y = x W^T for an HF linear weight W [out, in], in x's dtype.
  Value linear(Value x, const std::string& weightName, int64_t out, int64_t in) {
    return linear(x, param(weightName, {out, in}, "normal"), weightName);
  }
  Value linear(Value x, Value weight, const std::string& name) {
    SmallVector<int64_t> shape(shapeOf(x));
    shape.back() = shapeOf(weight)[0];
    return b_.create<MatmulOp>(loc(name), RankedTensorType::get(shape, elementTypeOf(x)), x, weight, b_.getBoolAttr(false),
                               b_.getBoolAttr(true));
  }

  Value rmsNorm(Value x, Value weight, const std::string& name) {
    return b_.create<RmsNormOp>(loc(name), x.getType(), x, weight, b_.getF64FloatAttr(config_.rmsNormEps));
  }
  Value rmsNorm(Value x, const std::string& weightName) {
    return rmsNorm(x, param(weightName, {shapeOf(x).back()}, "ones"), weightName);
  }
  Value weightlessNorm(Value x, const std::string& name) { return rmsNorm(x, Value(), name); }

  // gelu_tanh(x G^T) * (x U^T), then D^T: the dense MLP and the self-conditioning MLP.
  Value gatedMlp(Value x, const std::string& prefix, int64_t inner) {
    Value gate = linear(x, prefix + "gate_proj.weight", inner, hidden_);
    Value up = linear(x, prefix + "up_proj.weight", inner, hidden_);
    Value activated = b_.create<GeluTanhOp>(loc(prefix + "act"), gate.getType(), gate);
    return linear(mul(activated, up, prefix + "gated"), prefix + "down_proj.weight", hidden_, inner);
  }

  // ---- model pieces ------------------------------------------------------------------------------
  double embeddingScale() const {
    return config_.embeddingScale(mixedPrecision() ? dgemma::DType::BF16 : dgemma::DType::F32);
  }

  // E[ids] * sqrt(H) (rounded to the embedding dtype). Like torch's Embedding(padding_idx), lookups
  // of the pad id give the pad row no gradient (training.md §10); the tied head still does.
  Value embed(Value ids) {
    Value table = param(top("embed_tokens.weight"), {config_.vocabSize, hidden_}, "normal");
    SmallVector<int64_t> shape(shapeOf(ids));
    shape.push_back(hidden_);
    auto lookup = b_.create<GatherOp>(loc("embed"), activationType(shape), table, ids);
    lookup.setPaddingIdxAttr(b_.getI64IntegerAttr(config_.padTokenId));
    return mul(lookup, scalar(embeddingScale(), "embed.scale", activation_), "embed.scaled");
  }

  // model.md §7.1: the soft embedding (softmax(sc) E) s, times the per-example mask. The softmax of
  // the f32 logits is an fp32 island; its probabilities meet E in the activation dtype.
  Value selfConditioningSignal(Value logits, Value mask) {
    Value table = param(top("embed_tokens.weight"), {config_.vocabSize, hidden_}, "normal");
    Value probabilities = b_.create<SoftmaxOp>(loc("sc.softmax"), logits.getType(), logits, b_.getI64IntegerAttr(-1));
    Value expected = b_.create<MatmulOp>(loc("sc.soft_embedding"), activationType({batch_, canvasLength_, hidden_}),
                                         toActivation(probabilities, "sc.softmax"), table, b_.getBoolAttr(false),
                                         b_.getBoolAttr(false));
    Value scaled = mul(expected, scalar(embeddingScale(), "sc.scale", activation_), "sc.scaled");
    return mul(scaled, toActivation(reshape(mask, {batch_, 1, 1}, "sc.mask"), "sc.mask"), "sc.masked");
  }

  // model.md §7.1: x_dec = rmsnorm(E[xt] s + MLP(rmsnorm(signal; pre_norm))), weightless. Without a
  // signal (self-conditioning pass 1) the MLP's output is exactly zero and is left out.
  Value decoderInput(Value canvasIds, Value signal) {
    Value tokens = embed(canvasIds);
    if (!signal) return weightlessNorm(tokens, "sc.post_norm");
    Value normed = rmsNorm(signal, top("self_conditioning.pre_norm.weight"));
    Value mlp = gatedMlp(normed, top("self_conditioning."), config_.intermediateSize);
    return weightlessNorm(add(tokens, mlp, "sc.residual"), "sc.post_norm");
  }

  // The encoder stack over ids [B, T] (causal, key validity [B, T] i1); returns the last hidden
  // state before the final norm and, if asked, every layer's K/V.
  Value encoderStack(Value ids, Value keyValid, Value positions, std::vector<LayerKeyValues>* keyValuesOut) {
    Value hidden = embed(ids);
    for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
      hidden = layerForward(layer, hidden, positions, EncoderAttention{keyValid}, keyValuesOut);
    return hidden;
  }

  // The decoder over [prefix K/V ; canvas] from its input embedding; canvas positions continue after
  // the prompt, padding included (model.md §7.2). Returns the logits, soft-capped unless `capped` is false.
  Value decoderLogits(Value x, Value promptValid, const std::vector<LayerKeyValues>& keyValues, bool capped = true) {
    const int64_t promptLength = shapeOf(promptValid)[1];
    Value canvasValid = constantBool({batch_, canvasLength_}, true);
    Value decoderValid = concat({promptValid, canvasValid}, 1, "decoder.key_valid");
    Value decoderPositions = positions(promptLength, canvasLength_);
    for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
      x = layerForward(layer, x, decoderPositions, DecoderAttention{decoderValid, &keyValues[layer], promptLength}, nullptr);
    return head(x, capped);
  }

  // Heads of one projection: [B, T, heads * D] -> [B, T, heads, D].
  Value splitHeads(Value x, int64_t heads, int64_t headDim, const std::string& name) {
    return reshape(x, {shapeOf(x)[0], shapeOf(x)[1], heads, headDim}, name);
  }

  Value rope(Value x, Value positions, int64_t layer, const std::string& name) {
    const dgemma::LayerGeometry& geometry = config_.layer(layer);
    return b_.create<RopeOp>(loc(name), x.getType(), x, positions, b_.getF64FloatAttr(geometry.rope.theta),
                             b_.getI64IntegerAttr(config_.ropeRotatedPairs(layer)),
                             b_.getI64IntegerAttr(geometry.headDim), b_.getBoolAttr(false));
  }

  // model.md §5.4 with the encoder (§6.2) or decoder (§7.3) key set.
  template <typename KeySet>
  Value attention(int64_t layer, Value x, Value positions, const KeySet& keySet, std::vector<LayerKeyValues>* keyValuesOut) {
    const dgemma::LayerGeometry& geometry = config_.layer(layer);
    const int64_t headDim = geometry.headDim, queryHeads = geometry.numQueryHeads, kvHeads = geometry.numKeyValueHeads;
    const bool sliding = geometry.type == dgemma::AttentionLayerType::Sliding;
    auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };

    Value queries = splitHeads(linear(x, name("self_attn.q_proj.weight"), queryHeads * headDim, hidden_), queryHeads,
                               headDim, name("q"));
    queries = rope(rmsNorm(queries, name("self_attn.q_norm.weight")), positions, layer, name("q.rope"));
    Value rawKeys = splitHeads(linear(x, name("self_attn.k_proj.weight"), kvHeads * headDim, hidden_), kvHeads, headDim,
                               name("k"));
    // Full layers have no v_proj: V is the raw K projection (before k_norm and RoPE).
    Value rawValues = sliding ? splitHeads(linear(x, name("self_attn.v_proj.weight"), kvHeads * headDim, hidden_), kvHeads,
                                           headDim, name("v"))
                              : rawKeys;
    Value keys = rope(rmsNorm(rawKeys, name("self_attn.k_norm.weight")), positions, layer, name("k.rope"));
    Value values = weightlessNorm(rawValues, name("self_attn.v_norm"));

    SmallVector<int64_t> outShape{shapeOf(x)[0], shapeOf(x)[1], queryHeads, headDim};
    Value attended;
    if constexpr (std::is_same_v<KeySet, EncoderAttention>) {
      if (keyValuesOut) keyValuesOut->push_back({keys, values});
      attended = b_.create<AttentionOp>(loc(name("attention")), activationType(outShape), queries, keys, values, keySet.keyValid,
                                        AttentionMaskAttr::get(b_.getContext(), AttentionMask::Causal),
                                        b_.getI64IntegerAttr(sliding ? config_.slidingWindow : 0),
                                        b_.getI64IntegerAttr(0), b_.getF64FloatAttr(1.0));
    } else {
      // Sliding decoder layers see the last W-1 prefix slots, the same for every canvas query.
      Value allKeys = concat({keySet.prefix->keys, keys}, 1, name("decoder.keys"));
      Value allValues = concat({keySet.prefix->values, values}, 1, name("decoder.values"));
      attended = b_.create<AttentionOp>(loc(name("attention")), activationType(outShape), queries, allKeys, allValues,
                                        keySet.keyValid, AttentionMaskAttr::get(b_.getContext(), AttentionMask::Prefix),
                                        b_.getI64IntegerAttr(sliding ? config_.slidingWindow - 1 : 0),
                                        b_.getI64IntegerAttr(keySet.prefixLength), b_.getF64FloatAttr(1.0));
    }
    Value merged = reshape(attended, {outShape[0], outShape[1], queryHeads * headDim}, name("heads"));
    return linear(merged, name("self_attn.o_proj.weight"), hidden_, queryHeads * headDim);
  }

  // model.md §5.5: dense MLP and routed experts in parallel on the same residual.
  Value feedForward(int64_t layer, Value residual, Value tokenValid) {
    auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };
    const int64_t tokens = shapeOf(residual)[0] * shapeOf(residual)[1];
    Value dense = gatedMlp(rmsNorm(residual, name("pre_feedforward_layernorm.weight")), name("mlp."), config_.intermediateSize);
    Value denseOut = rmsNorm(dense, name("post_feedforward_layernorm_1.weight"));

    // The router reads the raw residual through its own weightless norm, scaled per channel and by
    // H^-1/2. From the norm's output on it is an fp32 island (logits, softmax and routing weights).
    Value routerInput = mul(toF32(weightlessNorm(residual, name("router.norm")), name("router.norm")),
                            islandParam(name("router.scale"), {hidden_}, "ones"), name("router.scaled"));
    routerInput = mul(routerInput, scalar(1.0 / std::sqrt(static_cast<double>(hidden_)), name("router.root")),
                      name("router.input"));
    Value routerLogits = linear(reshape(routerInput, {tokens, hidden_}, name("router.tokens")),
                                islandParam(name("router.proj.weight"), {config_.numExperts, hidden_}, "normal"),
                                name("router.proj.weight"));
    Value perExpertScale = islandParam(name("router.per_expert_scale"), {config_.numExperts}, "ones");
    auto route = b_.create<MoeRouteOp>(loc(name("router")), f32Type({tokens, config_.topKExperts}),
                                       RankedTensorType::get({tokens, config_.topKExperts}, b_.getI64Type()), routerLogits,
                                       perExpertScale, b_.getI64IntegerAttr(config_.topKExperts));

    if (auxTerms_) auxTerms_->push_back(loadBalancingLoss(layer, routerLogits, route.getIndices(), tokenValid));

    Value expertInput = reshape(rmsNorm(residual, name("pre_feedforward_layernorm_2.weight")), {tokens, hidden_},
                                name("experts.tokens"));
    Value gateUp = param(name("experts.gate_up_proj"), {config_.numExperts, 2 * config_.moeIntermediateSize, hidden_}, "normal");
    Value down = param(name("experts.down_proj"), {config_.numExperts, hidden_, config_.moeIntermediateSize}, "normal");
    Value experts = b_.create<MoeExpertsOp>(loc(name("experts")), activationType({tokens, hidden_}), expertInput,
                                            route.getWeights(), route.getIndices(), gateUp, down);
    Value expertsOut = rmsNorm(reshape(experts, shapeOf(residual), name("experts.out")),
                               name("post_feedforward_layernorm_2.weight"));
    return rmsNorm(add(denseOut, expertsOut, name("ffn.sum")), name("post_feedforward_layernorm.weight"));
  }

  // Switch-style load balancing (training.md §9, Megatron's definition): E / (k T²) Σ_e P_e c_e over
  // the call's T real tokens, with P_e the router probability mass of expert e and c_e its top-k
  // count (no gradient: a discrete choice). Padding tokens (tokenValid = 0) do not count: their
  // hidden states are never read. A null tokenValid means every token is real (the canvas).
  Value loadBalancingLoss(int64_t layer, Value routerLogits, Value indices, Value tokenValid) {
    auto name = [&](const std::string& suffix) { return layerName(layer, "aux." + suffix); };
    const int64_t tokens = shapeOf(routerLogits)[0], experts = config_.numExperts, topK = config_.topKExperts;
    Value weight = tokenValid ? castTo(reshape(tokenValid, {tokens, 1}, name("valid")), f32_, name("weight"))
                              : ones({tokens, 1}, name("weight"));
    Value probabilities = b_.create<SoftmaxOp>(loc(name("probs")), routerLogits.getType(), routerLogits, b_.getI64IntegerAttr(-1));
    Value mass = reduceSum(mul(probabilities, weight, name("probs.real")), {0}, name("mass"));
    Value choices = reshape(indices, {tokens * topK}, name("choices"));
    Value choiceWeights = reshape(mul(weight, ones({tokens, topK}, name("slots")), name("choice.weight")), {tokens * topK, 1},
                                  name("choice.weights"));
    Value counts = b_.create<ScatterAddOp>(loc(name("counts")), f32Type({experts, 1}), choices, choiceWeights);
    Value balance = reduceSum(mul(mass, reshape(counts, {experts}, name("counts.flat")), name("product")), {0}, name("sum"));
    Value real = maximum(reduceSum(weight, {0, 1}, name("tokens")), scalar(1.0, name("tokens.min")), name("tokens.clamped"));
    Value scale = div(scalar(static_cast<double>(experts) / static_cast<double>(topK), name("e_over_k")), mul(real, real, name("t2")),
                      name("scale"));
    return mul(balance, scale, name("loss"));
  }

  // model.md §5.6: sandwich norms; layer_scalar scales the whole residual stream.
  template <typename KeySet>
  Value layerForward(int64_t layer, Value hidden, Value positions, const KeySet& keySet,
                     std::vector<LayerKeyValues>* keyValuesOut) {
    auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };
    Value attended = attention(layer, rmsNorm(hidden, name("input_layernorm.weight")), positions, keySet, keyValuesOut);
    Value residual = add(hidden, rmsNorm(attended, name("post_attention_layernorm.weight")), name("attention.residual"));
    // Encoder queries are its keys (padding included); every decoder query is a canvas token.
    Value tokenValid;
    if constexpr (std::is_same_v<KeySet, EncoderAttention>) tokenValid = keySet.keyValid;
    Value out = add(residual, feedForward(layer, residual, tokenValid), name("ffn.residual"));
    return mul(out, param(name("layer_scalar"), {1}, "ones", /*trainable=*/false), name("layer_scalar.apply"));
  }

  // model.md §5.7: final norm, tied head (the unscaled embedding), soft-cap c * tanh(x / c) unless
  // `capped` is false (a cross-entropy that caps itself). The head's output is widened to f32 (as HF
  // casts it) before the soft-cap.
  Value head(Value x, bool capped = true) {
    Value normed = rmsNorm(x, param(top("norm.weight"), {hidden_}, "ones"), "decoder.norm");
    Value table = param(top("embed_tokens.weight"), {config_.vocabSize, hidden_}, "normal");
    Value logits = toF32(b_.create<MatmulOp>(loc("head"), activationType({batch_, canvasLength_, config_.vocabSize}), normed,
                                             table, b_.getBoolAttr(false), b_.getBoolAttr(true)),
                         "head");
    const double cap = config_.finalLogitSoftcapping;
    if (cap <= 0 || !capped) return logits;
    Value squashed = b_.create<TanhOp>(loc("softcap"), logits.getType(), div(logits, scalar(cap, "softcap.c"), "softcap.in"));
    return mul(squashed, scalar(cap, "softcap.c"), "softcap.out");
  }

  OpBuilder& b_;
  const DiffusionGemmaConfig& config_;
  int64_t batch_, canvasLength_, hidden_;
  Type f32_;
  Type activation_;  // f32, or bf16 in mixed precision
  std::vector<Value>* auxTerms_ = nullptr;  // where pass-2 MoE calls record their load-balancing loss
};

// Adds an entry-point function `symbol` (entry `entry`, bucket `bucket`) and fills it with `body`.
template <typename Body>
void addEntry(OpBuilder& builder, ModuleOp module, const std::string& symbol, StringRef entry,
              ArrayRef<std::pair<StringRef, int64_t>> bucket, Body body) {
  OpBuilder::InsertionGuard guard(builder);
  builder.setInsertionPointToEnd(module.getBody());
  Location loc = NameLoc::get(builder.getStringAttr("diffusion_gemma." + entry.str()));
  auto function = builder.create<func::FuncOp>(loc, symbol, builder.getFunctionType({}, {}));
  function->setAttr(kEntryAttr, builder.getStringAttr(entry));
  SmallVector<NamedAttribute> dimensions;
  for (auto [name, size] : bucket) dimensions.push_back(builder.getNamedAttr(name, builder.getI64IntegerAttr(size)));
  function->setAttr(kBucketAttr, builder.getDictionaryAttr(dimensions));
  builder.setInsertionPointToStart(function.addEntryBlock());
  body();
  builder.create<func::ReturnOp>(loc);
}

OwningOpRef<ModuleOp> createModule(MLIRContext& context) {
  context.loadDialect<DgDialect, func::FuncDialect>();
  return ModuleOp::create(NameLoc::get(StringAttr::get(&context, "diffusion_gemma")));
}

}  // namespace

std::optional<Precision> parsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  return std::nullopt;
}

const char* precisionName(Precision precision) { return precision == Precision::Bf16 ? "bf16" : "fp32"; }

std::optional<DiffusionGemmaObjective::Variant> parseObjectiveVariant(const std::string& name) {
  using Variant = DiffusionGemmaObjective::Variant;
  if (name == "base-sft") return Variant::BaseSft;
  if (name == "reweighted-ce") return Variant::ReweightedCe;
  if (name == "loo-ce") return Variant::LooCe;
  if (name == "reweighted-loo-ce" || name == "loo-reweighted-ce") return Variant::ReweightedLooCe;
  return std::nullopt;
}

const char* objectiveVariantName(DiffusionGemmaObjective::Variant variant) {
  switch (variant) {
    case DiffusionGemmaObjective::Variant::BaseSft: return "base-sft";
    case DiffusionGemmaObjective::Variant::ReweightedCe: return "reweighted-ce";
    case DiffusionGemmaObjective::Variant::LooCe: return "loo-ce";
    case DiffusionGemmaObjective::Variant::ReweightedLooCe: return "reweighted-loo-ce";
  }
  return "unknown";
}

OwningOpRef<ModuleOp> buildDiffusionGemmaForward(MLIRContext& context, const DiffusionGemmaConfig& config,
                                                 const DiffusionGemmaForwardOptions& options) {
  OwningOpRef<ModuleOp> module = createModule(context);
  OpBuilder builder(&context);
  for (int64_t promptLength : options.promptLengths)
    addEntry(builder, *module, "forward_p" + std::to_string(promptLength), "forward",
             {{"micro_batch", options.microBatch}, {"prompt_len", promptLength}, {"canvas_len", config.canvasLength}},
             [&] { ModelBuilder(builder, config, options.microBatch, options.precision).buildForward(promptLength); });
  return module;
}

OwningOpRef<ModuleOp> buildDiffusionGemmaTrain(MLIRContext& context, const DiffusionGemmaConfig& config,
                                               const DiffusionGemmaTrainOptions& options) {
  OwningOpRef<ModuleOp> module = createModule(context);
  OpBuilder builder(&context);
  addEntry(builder, *module, "corrupt", "corrupt", {{"micro_batch", options.microBatch}, {"canvas_len", config.canvasLength}},
           [&] { ModelBuilder(builder, config, options.microBatch, options.precision).buildCorrupt(options.objective); });
  for (int64_t promptLength : options.promptLengths)
    addEntry(builder, *module, "train_step_p" + std::to_string(promptLength), "train_step",
             {{"micro_batch", options.microBatch}, {"prompt_len", promptLength}, {"canvas_len", config.canvasLength}},
             [&] { ModelBuilder(builder, config, options.microBatch, options.precision).buildTrainStep(promptLength, options.objective); });
  return module;
}

}  // namespace mlir::dg
