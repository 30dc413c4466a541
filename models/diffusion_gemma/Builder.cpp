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

class ForwardBuilder {
 public:
  ForwardBuilder(OpBuilder& builder, const DiffusionGemmaConfig& config, int64_t batch, int64_t promptLength)
      : b_(builder), config_(config), batch_(batch), promptLength_(promptLength), canvasLength_(config.canvasLength),
        hidden_(config.hiddenSize), f32_(builder.getF32Type()) {}

  void build() {
    Value inputIds = input("input_ids", {batch_, promptLength_}, b_.getI64Type());
    Value attentionMask = input("attention_mask", {batch_, promptLength_}, b_.getI64Type());
    Value canvasIds = input("noisy_canvas_ids", {batch_, canvasLength_}, b_.getI64Type());
    Value selfConditioningLogits = input("self_conditioning_logits", {batch_, canvasLength_, config_.vocabSize}, f32_);
    Value selfConditioningMask = input("self_conditioning_mask", {batch_}, f32_);

    Value promptValid = castTo(attentionMask, b_.getI1Type(), "attention_mask");

    // Encoder: positions 0..P-1 for every row (left padding occupies positions, masks exclude it).
    Value encoderPositions = positions(0, promptLength_);
    Value hidden = embed(inputIds);
    std::vector<LayerKeyValues> keyValues;
    for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
      hidden = layerForward(layer, hidden, encoderPositions, EncoderAttention{promptValid}, &keyValues);
    output("encoder_hidden", rmsNorm(hidden, param(top("norm.weight"), {hidden_}, "ones"), "encoder.norm"));
    for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer) {
      output("encoder_k." + std::to_string(layer), keyValues[layer].keys);
      output("encoder_v." + std::to_string(layer), keyValues[layer].values);
    }

    // Decoder: canvas positions continue after the prompt, padding included (model.md §7.2).
    Value canvasValid = constantBool({batch_, canvasLength_}, true);
    Value decoderValid = concat({promptValid, canvasValid}, 1, "decoder.key_valid");
    Value decoderPositions = positions(promptLength_, canvasLength_);
    Value x = selfConditionedInput(canvasIds, selfConditioningLogits, selfConditioningMask);
    for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
      x = layerForward(layer, x, decoderPositions, DecoderAttention{decoderValid, &keyValues[layer], promptLength_}, nullptr);
    output("logits", head(x));
  }

 private:
  // ---- naming and small helpers ----------------------------------------------------------------
  static std::string top(const std::string& suffix) { return "model.decoder." + suffix; }
  static std::string layerName(int64_t layer, const std::string& suffix) {
    return "model.decoder.layers." + std::to_string(layer) + "." + suffix;
  }
  Location loc(const std::string& name) { return NameLoc::get(b_.getStringAttr("diffusion_gemma." + name)); }
  RankedTensorType f32Type(ArrayRef<int64_t> shape) { return RankedTensorType::get(shape, f32_); }
  static ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

  Value input(const std::string& name, ArrayRef<int64_t> shape, Type element) {
    return b_.create<InputOp>(loc(name), RankedTensorType::get(shape, element), b_.getStringAttr(name));
  }
  void output(const std::string& name, Value value) { b_.create<OutputOp>(loc(name), name, value); }

  // HF's initialisation: linear and embedding weights N(0, 0.02); norm weights and scales 1.
  Value param(const std::string& name, ArrayRef<int64_t> shape, StringRef init, bool trainable = true) {
    SmallVector<NamedAttribute> fields{b_.getNamedAttr("kind", b_.getStringAttr(init))};
    if (init == "normal") fields.push_back(b_.getNamedAttr("std", b_.getF64FloatAttr(0.02)));
    return b_.create<ParamOp>(loc(name), f32Type(shape), b_.getStringAttr(name), b_.getDictionaryAttr(fields),
                              b_.getBoolAttr(trainable));
  }

  Value scalar(double value, const std::string& name) {
    return b_.create<FillOp>(loc(name), f32Type({}), b_.getF64FloatAttr(value));
  }

  Value binary(StringRef kind, Value lhs, Value rhs, const std::string& name) {
    auto shape = *broadcastShapes(shapeOf(lhs), shapeOf(rhs));
    auto type = RankedTensorType::get(shape, cast<RankedTensorType>(lhs.getType()).getElementType());
    if (kind == "add") return b_.create<AddOp>(loc(name), type, lhs, rhs);
    if (kind == "mul") return b_.create<MulOp>(loc(name), type, lhs, rhs);
    return b_.create<DivOp>(loc(name), type, lhs, rhs);
  }
  Value add(Value lhs, Value rhs, const std::string& name) { return binary("add", lhs, rhs, name); }
  Value mul(Value lhs, Value rhs, const std::string& name) { return binary("mul", lhs, rhs, name); }

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

  // y = x W^T for an HF linear weight W [out, in].
  Value linear(Value x, const std::string& weightName, int64_t out, int64_t in) {
    Value weight = param(weightName, {out, in}, "normal");
    SmallVector<int64_t> shape(shapeOf(x));
    shape.back() = out;
    return b_.create<MatmulOp>(loc(weightName), f32Type(shape), x, weight, b_.getBoolAttr(false), b_.getBoolAttr(true));
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
  double embeddingScale() const { return config_.embeddingScale(dgemma::DType::F32); }

  // E[ids] * sqrt(H) (rounded to the embedding dtype).
  Value embed(Value ids) {
    Value table = param(top("embed_tokens.weight"), {config_.vocabSize, hidden_}, "normal");
    SmallVector<int64_t> shape(shapeOf(ids));
    shape.push_back(hidden_);
    Value rows = b_.create<GatherOp>(loc("embed"), f32Type(shape), table, ids);
    return mul(rows, scalar(embeddingScale(), "embed.scale"), "embed.scaled");
  }

  // model.md §7.1: x_dec = rmsnorm(E[xt] s + MLP(rmsnorm((softmax(sc) E) s m; pre_norm))), weightless.
  Value selfConditionedInput(Value canvasIds, Value logits, Value mask) {
    Value tokens = embed(canvasIds);
    Value table = param(top("embed_tokens.weight"), {config_.vocabSize, hidden_}, "normal");
    Value probabilities = b_.create<SoftmaxOp>(loc("sc.softmax"), logits.getType(), logits, b_.getI64IntegerAttr(-1));
    Value expected = b_.create<MatmulOp>(loc("sc.soft_embedding"), f32Type({batch_, canvasLength_, hidden_}), probabilities,
                                         table, b_.getBoolAttr(false), b_.getBoolAttr(false));
    Value scaled = mul(expected, scalar(embeddingScale(), "sc.scale"), "sc.scaled");
    Value signal = mul(scaled, reshape(mask, {batch_, 1, 1}, "sc.mask"), "sc.masked");
    Value normed = rmsNorm(signal, top("self_conditioning.pre_norm.weight"));
    Value mlp = gatedMlp(normed, top("self_conditioning."), config_.intermediateSize);
    return weightlessNorm(add(tokens, mlp, "sc.residual"), "sc.post_norm");
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
      keyValuesOut->push_back({keys, values});
      attended = b_.create<AttentionOp>(loc(name("attention")), f32Type(outShape), queries, keys, values, keySet.keyValid,
                                        b_.getStringAttr("causal"), b_.getI64IntegerAttr(sliding ? config_.slidingWindow : 0),
                                        b_.getI64IntegerAttr(0), b_.getF64FloatAttr(1.0));
    } else {
      // Sliding decoder layers see the last W-1 prefix slots, the same for every canvas query.
      Value allKeys = concat({keySet.prefix->keys, keys}, 1, name("decoder.keys"));
      Value allValues = concat({keySet.prefix->values, values}, 1, name("decoder.values"));
      attended = b_.create<AttentionOp>(loc(name("attention")), f32Type(outShape), queries, allKeys, allValues,
                                        keySet.keyValid, b_.getStringAttr("prefix"),
                                        b_.getI64IntegerAttr(sliding ? config_.slidingWindow - 1 : 0),
                                        b_.getI64IntegerAttr(keySet.prefixLength), b_.getF64FloatAttr(1.0));
    }
    Value merged = reshape(attended, {outShape[0], outShape[1], queryHeads * headDim}, name("heads"));
    return linear(merged, name("self_attn.o_proj.weight"), hidden_, queryHeads * headDim);
  }

  // model.md §5.5: dense MLP and routed experts in parallel on the same residual.
  Value feedForward(int64_t layer, Value residual) {
    auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };
    const int64_t tokens = shapeOf(residual)[0] * shapeOf(residual)[1];
    Value dense = gatedMlp(rmsNorm(residual, name("pre_feedforward_layernorm.weight")), name("mlp."), config_.intermediateSize);
    Value denseOut = rmsNorm(dense, name("post_feedforward_layernorm_1.weight"));

    // The router reads the raw residual through its own weightless norm, scaled per channel and by H^-1/2.
    Value routerInput = mul(weightlessNorm(residual, name("router.norm")), param(name("router.scale"), {hidden_}, "ones"),
                            name("router.scaled"));
    routerInput = mul(routerInput, scalar(1.0 / std::sqrt(static_cast<double>(hidden_)), name("router.root")),
                      name("router.input"));
    Value routerLogits = linear(reshape(routerInput, {tokens, hidden_}, name("router.tokens")), name("router.proj.weight"),
                                config_.numExperts, hidden_);
    Value perExpertScale = param(name("router.per_expert_scale"), {config_.numExperts}, "ones");
    auto route = b_.create<MoeRouteOp>(loc(name("router")), f32Type({tokens, config_.topKExperts}),
                                       RankedTensorType::get({tokens, config_.topKExperts}, b_.getI64Type()), routerLogits,
                                       perExpertScale, b_.getI64IntegerAttr(config_.topKExperts));

    Value expertInput = reshape(rmsNorm(residual, name("pre_feedforward_layernorm_2.weight")), {tokens, hidden_},
                                name("experts.tokens"));
    Value gateUp = param(name("experts.gate_up_proj"), {config_.numExperts, 2 * config_.moeIntermediateSize, hidden_}, "normal");
    Value down = param(name("experts.down_proj"), {config_.numExperts, hidden_, config_.moeIntermediateSize}, "normal");
    Value experts = b_.create<MoeExpertsOp>(loc(name("experts")), f32Type({tokens, hidden_}), expertInput,
                                            route.getWeights(), route.getIndices(), gateUp, down);
    Value expertsOut = rmsNorm(reshape(experts, shapeOf(residual), name("experts.out")),
                               name("post_feedforward_layernorm_2.weight"));
    return rmsNorm(add(denseOut, expertsOut, name("ffn.sum")), name("post_feedforward_layernorm.weight"));
  }

  // model.md §5.6: sandwich norms; layer_scalar scales the whole residual stream.
  template <typename KeySet>
  Value layerForward(int64_t layer, Value hidden, Value positions, const KeySet& keySet,
                     std::vector<LayerKeyValues>* keyValuesOut) {
    auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };
    Value attended = attention(layer, rmsNorm(hidden, name("input_layernorm.weight")), positions, keySet, keyValuesOut);
    Value residual = add(hidden, rmsNorm(attended, name("post_attention_layernorm.weight")), name("attention.residual"));
    Value out = add(residual, feedForward(layer, residual), name("ffn.residual"));
    return mul(out, param(name("layer_scalar"), {1}, "ones", /*trainable=*/false), name("layer_scalar.apply"));
  }

  // model.md §5.7: final norm, tied head (the unscaled embedding), soft-cap c * tanh(x / c).
  Value head(Value x) {
    Value normed = rmsNorm(x, param(top("norm.weight"), {hidden_}, "ones"), "decoder.norm");
    Value table = param(top("embed_tokens.weight"), {config_.vocabSize, hidden_}, "normal");
    Value logits = b_.create<MatmulOp>(loc("head"), f32Type({batch_, canvasLength_, config_.vocabSize}), normed, table,
                                       b_.getBoolAttr(false), b_.getBoolAttr(true));
    const double cap = config_.finalLogitSoftcapping;
    if (cap <= 0) return logits;
    Value squashed = b_.create<TanhOp>(loc("softcap"), logits.getType(), binary("div", logits, scalar(cap, "softcap.c"), "softcap.in"));
    return mul(squashed, scalar(cap, "softcap.c"), "softcap.out");
  }

  OpBuilder& b_;
  const DiffusionGemmaConfig& config_;
  int64_t batch_, promptLength_, canvasLength_, hidden_;
  Type f32_;
};

}  // namespace

OwningOpRef<ModuleOp> buildDiffusionGemmaForward(MLIRContext& context, const DiffusionGemmaConfig& config,
                                                 const DiffusionGemmaForwardOptions& options) {
  context.loadDialect<DgDialect, func::FuncDialect>();
  OpBuilder builder(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(NameLoc::get(builder.getStringAttr("diffusion_gemma")));
  builder.setInsertionPointToEnd(module->getBody());
  for (int64_t promptLength : options.promptLengths) {
    Location loc = NameLoc::get(builder.getStringAttr("diffusion_gemma.forward"));
    auto function = builder.create<func::FuncOp>(loc, "forward_p" + std::to_string(promptLength), builder.getFunctionType({}, {}));
    function->setAttr(kEntryAttr, builder.getStringAttr("forward"));
    function->setAttr(kBucketAttr, builder.getDictionaryAttr({
                                       builder.getNamedAttr("micro_batch", builder.getI64IntegerAttr(options.microBatch)),
                                       builder.getNamedAttr("prompt_len", builder.getI64IntegerAttr(promptLength)),
                                       builder.getNamedAttr("canvas_len", builder.getI64IntegerAttr(config.canvasLength)),
                                   }));
    OpBuilder::InsertionGuard guard(builder);
    builder.setInsertionPointToStart(function.addEntryBlock());
    ForwardBuilder(builder, config, options.microBatch, promptLength).build();
    builder.create<func::ReturnOp>(loc);
  }
  return module;
}

}  // namespace mlir::dg
