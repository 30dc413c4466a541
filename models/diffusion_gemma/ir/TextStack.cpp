#include "models/diffusion_gemma/ir/TextStack.h"

#include <cmath>

#include "dialects/dg/IR/DgMesh.h"
#include "dialects/dg/IR/DgRecompute.h"

namespace mlir::dg::diffusion_gemma {

TextStack::TextStack(GraphBuilder& graph)
    : g_(graph),
      b_(graph.builder()),
      config_(graph.config()),
      batch_(graph.batch()),
      canvasLength_(graph.config().canvasLength),
      hidden_(graph.config().hiddenSize),
      f32_(graph.f32()),
      activation_(graph.activation()) {}

// gelu_tanh(x G^T) * (x U^T), then D^T: the dense MLP and the self-conditioning MLP.
Value TextStack::gatedMlp(Value x, const std::string& prefix, int64_t inner) {
  Value gate = g_.linear(x, prefix + "gate_proj.weight", inner, hidden_);
  Value up = g_.linear(x, prefix + "up_proj.weight", inner, hidden_);
  Value activated = b_.create<GeluTanhOp>(g_.loc(prefix + "act"), gate);
  return g_.linear(g_.mul(activated, up, prefix + "gated"), prefix + "down_proj.weight", hidden_, inner);
}

// The embedding [V', H]: the vocabulary's V rows, then V' - V rows of padding (docs/parallelism.md,
// "Vocabulary padding") that no id looks up and whose head columns are cut off before any softmax.
Value TextStack::embeddingTable() {
  return g_.param(top("embed_tokens.weight"), {config_.paddedVocabSize, hidden_}, "normal", /*trainable=*/true,
                  config_.vocabSize);
}

// The first V columns of head logits [..., V']: everything after the head sees the vocabulary alone,
// so the padding reaches no softmax, loss or sampler and its rows get an exactly zero gradient.
Value TextStack::withoutVocabularyPadding(Value logits, const std::string& name) {
  if (config_.paddedVocabSize == config_.vocabSize) return logits;
  return g_.slice(logits, static_cast<int64_t>(shapeOf(logits).size()) - 1, 0, config_.vocabSize, name);
}

double TextStack::embeddingScale() const {
  return config_.embeddingScale(g_.mixedPrecision() ? dgemma::DType::BF16 : dgemma::DType::F32);
}

// E[ids] * sqrt(H) (rounded to the embedding dtype). Like torch's Embedding(padding_idx), lookups
// of the pad id give the pad row no gradient (docs/training.md, "Gradient paths"); the tied head still does.
Value TextStack::embed(Value ids) {
  Value table = embeddingTable();
  auto lookup = b_.create<GatherOp>(g_.loc("embed"), table, ids, b_.getI64IntegerAttr(config_.padTokenId));
  return g_.mul(lookup, g_.scalar(embeddingScale(), "embed.scale", activation_), "embed.scaled");
}

// docs/model.md, "Self-conditioning": the soft embedding (softmax(sc) E) s, times the per-example mask. The softmax of
// the f32 logits is an fp32 island; its probabilities meet E in the activation dtype.
Value TextStack::selfConditioningSignal(Value logits, Value mask) {
  Value table = embeddingTable();
  Value probabilities = b_.create<SoftmaxOp>(g_.loc("sc.softmax"), logits, b_.getI64IntegerAttr(-1));
  // The probabilities cover the V real ids; the padding rows take no part.
  if (config_.paddedVocabSize != config_.vocabSize) table = g_.slice(table, 0, 0, config_.vocabSize, "sc.table");
  Value expected = b_.create<MatmulOp>(g_.loc("sc.soft_embedding"), g_.toActivation(probabilities, "sc.softmax"), table,
                                       b_.getBoolAttr(false), b_.getBoolAttr(false));
  Value scaled = g_.mul(expected, g_.scalar(embeddingScale(), "sc.scale", activation_), "sc.scaled");
  return g_.mul(scaled, g_.toActivation(g_.reshape(mask, {batch_, 1, 1}, "sc.mask"), "sc.mask"), "sc.masked");
}

// docs/model.md, "Self-conditioning": x_dec = rmsnorm(E[xt] s + MLP(rmsnorm(signal; pre_norm))), weightless. Without a
// signal (self-conditioning pass 1) the MLP's output is exactly zero and is left out.
Value TextStack::decoderInput(Value canvasIds, Value signal) {
  Value tokens = embed(canvasIds);
  if (!signal) return g_.weightlessNorm(tokens, "sc.post_norm");
  Value normed = g_.rmsNorm(signal, top("self_conditioning.pre_norm.weight"));
  Value mlp = gatedMlp(normed, top("self_conditioning."), config_.intermediateSize);
  return g_.weightlessNorm(g_.add(tokens, mlp, "sc.residual"), "sc.post_norm");
}

// The encoder stack over ids [B, T] (causal, key validity [B, T] i1, optionally the image overlay's
// segment ids on every layer); returns the last hidden state before the final norm and, if asked,
// every layer's K/V.
Value TextStack::encoderStack(Value ids, Value keyValid, Value positions, std::vector<LayerKeyValues>* keyValuesOut,
                              Value segmentIds) {
  return encoderStackOverEmbeddings(embed(ids), keyValid, positions, keyValuesOut, segmentIds);
}

Value TextStack::encoderStackOverEmbeddings(Value embeddings, Value keyValid, Value positions,
                                            std::vector<LayerKeyValues>* keyValuesOut, Value segmentIds) {
  Value hidden = embeddings;
  // Context parallelism splits the encoder's sequence from here on (docs/parallelism.md, "Context
  // parallelism"); without a context axis the mark is ignored.
  hidden.getDefiningOp()->setAttr(kContextSplitAttr, b_.getUnitAttr());
  const EncoderAttention keySet{keyValid, nullptr, Value(), segmentIds};
  for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
    hidden = layerForward(layer, hidden, positions, keySet, keyValuesOut);
  return hidden;
}

Value TextStack::packedStack(Value ids, Value keyValid, Value positions, Value documentIds, AttentionMask mask,
                             std::vector<LayerKeyValues>* keyValuesOut) {
  Value hidden = embed(ids);
  const EncoderAttention keySet{keyValid, nullptr, Value(), Value(), documentIds, mask};
  for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
    hidden = layerForward(layer, hidden, positions, keySet, keyValuesOut);
  return hidden;
}

// Every prefix and block key is valid: padding is a document of its own, kept apart by documentIds.
Value TextStack::packedDecoderBlock(Value x, Value positions, const std::vector<LayerKeyValues>* prefix,
                                    Value documentIds) {
  const int64_t keyLength = shapeOf(documentIds)[1];
  const int64_t prefixLength = keyLength - shapeOf(x)[1];
  Value keyValid = g_.constantBool({batch_, keyLength}, true, "block.key_valid");
  for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer) {
    const DecoderAttention keySet{keyValid, prefix ? &(*prefix)[layer] : nullptr, prefixLength, documentIds};
    x = layerForward(layer, x, positions, keySet, nullptr);
  }
  return x;
}

// Like encoderStack, over a block that continues the cache: the block's tokens are all real, and each
// layer's keys are [its cache ; the block], the block's queries being the last T of them.
Value TextStack::encoderStackOverCache(Value ids, Value positions, const std::vector<LayerCache>& caches,
                                       std::vector<LayerKeyValues>* keyValuesOut) {
  const int64_t blockLength = shapeOf(ids)[1];
  Value blockValid = g_.constantBool({batch_, blockLength}, true, "block.key_valid");
  Value hidden = embed(ids);
  for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer) {
    const LayerCache& cache = caches[layer];
    Value keyValid = g_.concat({cache.keyValid, blockValid}, 1, layerName(layer, "cached.key_valid"));
    hidden = layerForward(layer, hidden, positions, EncoderAttention{keyValid, &cache, blockValid}, keyValuesOut);
  }
  return hidden;
}

// Like decoderLogits with the cache as the prefix. A sliding layer's cache keeps min(C, W - 1)
// slots, so the last W - 1 prefix slots the window shows are exactly the slots the cache holds.
Value TextStack::decoderLogitsOverCache(Value x, Value positions, const std::vector<LayerCache>& caches, bool capped) {
  Value canvasValid = g_.constantBool({batch_, canvasLength_}, true, "canvas.key_valid");
  for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer) {
    const LayerCache& cache = caches[layer];
    const LayerKeyValues prefix{cache.keys, cache.values};
    Value keyValid = g_.concat({cache.keyValid, canvasValid}, 1, layerName(layer, "decoder.key_valid"));
    x = layerForward(layer, x, positions, DecoderAttention{keyValid, &prefix, shapeOf(cache.keyValid)[1]}, nullptr);
  }
  return head(x, capped);
}

// The decoder over [prefix K/V ; canvas] from its input embedding; canvas positions continue after
// the prompt, padding included (docs/model.md, "Decoder positions"). Returns the logits, soft-capped unless `capped` is false.
Value TextStack::decoderLogits(Value x, Value promptValid, const std::vector<LayerKeyValues>& keyValues, bool capped) {
  const int64_t promptLength = shapeOf(promptValid)[1];
  Value canvasValid = g_.constantBool({batch_, canvasLength_}, true, "canvas.key_valid");
  Value decoderValid = g_.concat({promptValid, canvasValid}, 1, "decoder.key_valid");
  Value decoderPositions = g_.positions(promptLength, canvasLength_);
  for (int64_t layer = 0; layer < config_.numHiddenLayers; ++layer)
    x = layerForward(layer, x, decoderPositions, DecoderAttention{decoderValid, &keyValues[layer], promptLength},
                     nullptr);
  return head(x, capped);
}

// Heads of one projection: [B, T, heads * D] -> [B, T, heads, D].
Value TextStack::splitHeads(Value x, int64_t heads, int64_t headDim, const std::string& name) {
  return g_.reshape(x, {shapeOf(x)[0], shapeOf(x)[1], heads, headDim}, name);
}

Value TextStack::rope(Value x, Value positions, int64_t layer, const std::string& name) {
  const dgemma::LayerGeometry& geometry = config_.layer(layer);
  return b_.create<RopeOp>(g_.loc(name), x, positions, b_.getF64FloatAttr(geometry.rope.theta),
                           b_.getI64IntegerAttr(config_.ropeRotatedPairs(layer)),
                           b_.getI64IntegerAttr(geometry.headDim), b_.getBoolAttr(false));
}

// docs/model.md, "Attention", with the encoder's key set ("Encoder attention mask") or the
// decoder's ("Decoder attention").
template <typename KeySet>
Value TextStack::attention(int64_t layer, Value x, Value positions, const KeySet& keySet,
                           std::vector<LayerKeyValues>* keyValuesOut) {
  const dgemma::LayerGeometry& geometry = config_.layer(layer);
  const int64_t headDim = geometry.headDim, queryHeads = geometry.numQueryHeads, kvHeads = geometry.numKeyValueHeads;
  const bool sliding = geometry.type == dgemma::AttentionLayerType::Sliding;
  auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };

  Value queries = splitHeads(g_.linear(x, name("self_attn.q_proj.weight"), queryHeads * headDim, hidden_), queryHeads,
                             headDim, name("q"));
  queries = rope(g_.rmsNorm(queries, name("self_attn.q_norm.weight")), positions, layer, name("q.rope"));
  // K and V heads are shared by query groups: tensor parallelism may replicate them (dg.heads).
  auto keyValueProjection = [&](const std::string& weightName) {
    Value weight = g_.param(weightName, {kvHeads * headDim, hidden_}, "normal");
    // The f32 master, read directly or through its cast to the activation dtype.
    auto master = weight.getDefiningOp<ParamOp>();
    if (!master) master = weight.getDefiningOp()->getOperand(0).getDefiningOp<ParamOp>();
    master->setAttr(kHeadsAttr, b_.getI64IntegerAttr(kvHeads));
    return g_.linear(x, weight, weightName);
  };
  Value rawKeys = splitHeads(keyValueProjection(name("self_attn.k_proj.weight")), kvHeads, headDim, name("k"));
  // Full layers have no v_proj: V is the raw K projection (before k_norm and RoPE).
  Value rawValues =
      sliding ? splitHeads(keyValueProjection(name("self_attn.v_proj.weight")), kvHeads, headDim, name("v")) : rawKeys;
  Value keys = rope(g_.rmsNorm(rawKeys, name("self_attn.k_norm.weight")), positions, layer, name("k.rope"));
  Value values = g_.weightlessNorm(rawValues, name("self_attn.v_norm"));

  SmallVector<int64_t> outShape{shapeOf(x)[0], shapeOf(x)[1], queryHeads, headDim};
  Value attended;
  if constexpr (std::is_same_v<KeySet, EncoderAttention>) {
    if (keyValuesOut) keyValuesOut->push_back({keys, values});
    Value allKeys = keys, allValues = values;
    if (keySet.cache) {
      allKeys = g_.concat({keySet.cache->keys, keys}, 1, name("cached.keys"));
      allValues = g_.concat({keySet.cache->values, values}, 1, name("cached.values"));
    }
    // A sliding layer sees the last W positions under the causal mask. Under the bidirectional one
    // it follows HF's convention for a bidirectional Gemma stack (use_bidirectional_attention "all",
    // docs/model.md): |i - j| <= W // 2 + 1, which is dg.attention's symmetric window W // 2 + 2.
    const int64_t window = !sliding                                      ? 0
                           : keySet.mask == AttentionMask::Bidirectional ? config_.slidingWindow / 2 + 2
                                                                         : config_.slidingWindow;
    attended =
        b_.create<AttentionOp>(g_.loc(name("attention")), queries, allKeys, allValues, keySet.keyValid,
                               AttentionMaskAttr::get(b_.getContext(), keySet.mask), b_.getI64IntegerAttr(window),
                               b_.getI64IntegerAttr(0), b_.getF64FloatAttr(1.0), keySet.segmentIds, keySet.documentIds);
  } else {
    // Sliding decoder layers see the last W-1 prefix slots, the same for every canvas query.
    Value allKeys = keySet.prefix ? g_.concat({keySet.prefix->keys, keys}, 1, name("decoder.keys")) : keys;
    Value allValues = keySet.prefix ? g_.concat({keySet.prefix->values, values}, 1, name("decoder.values")) : values;
    attended = b_.create<AttentionOp>(g_.loc(name("attention")), queries, allKeys, allValues, keySet.keyValid,
                                      AttentionMaskAttr::get(b_.getContext(), AttentionMask::Prefix),
                                      b_.getI64IntegerAttr(sliding ? config_.slidingWindow - 1 : 0),
                                      b_.getI64IntegerAttr(keySet.prefixLength), b_.getF64FloatAttr(1.0),
                                      /*segment_ids=*/Value(), keySet.documentIds);
  }
  Value merged = g_.reshape(attended, {outShape[0], outShape[1], queryHeads * headDim}, name("heads"));
  return g_.linear(merged, name("self_attn.o_proj.weight"), hidden_, queryHeads * headDim);
}

// docs/model.md, "Dense MLP and experts": dense MLP and routed experts in parallel on the same residual.
Value TextStack::feedForward(int64_t layer, Value residual, Value tokenValid) {
  auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };
  const int64_t tokens = shapeOf(residual)[0] * shapeOf(residual)[1];
  Value dense =
      gatedMlp(g_.rmsNorm(residual, name("pre_feedforward_layernorm.weight")), name("mlp."), config_.intermediateSize);
  Value denseOut = g_.rmsNorm(dense, name("post_feedforward_layernorm_1.weight"));

  // The router reads the raw residual through its own weightless norm, scaled per channel and by
  // H^-1/2. From the norm's output on it is an fp32 island (logits, softmax and routing weights).
  Value routerInput = g_.mul(g_.toF32(g_.weightlessNorm(residual, name("router.norm")), name("router.norm")),
                             g_.islandParam(name("router.scale"), {hidden_}, "ones"), name("router.scaled"));
  routerInput = g_.mul(routerInput, g_.scalar(1.0 / std::sqrt(static_cast<double>(hidden_)), name("router.root")),
                       name("router.input"));
  Value routerLogits = g_.linear(g_.reshape(routerInput, {tokens, hidden_}, name("router.tokens")),
                                 g_.islandParam(name("router.proj.weight"), {config_.numExperts, hidden_}, "normal"),
                                 name("router.proj.weight"));
  Value perExpertScale = g_.islandParam(name("router.per_expert_scale"), {config_.numExperts}, "ones");
  auto route = b_.create<MoeRouteOp>(g_.loc(name("router")), routerLogits, perExpertScale,
                                     b_.getI64IntegerAttr(config_.topKExperts));

  if (auxTerms_) auxTerms_->push_back(loadBalancingLoss(layer, routerLogits, route.getIndices(), tokenValid));

  Value expertNormed = g_.rmsNorm(residual, name("pre_feedforward_layernorm_2.weight"));
  Value routeWeights = route.getWeights(), routeIndices = route.getIndices();
  // [B, S, ...] rows to [S·B] order and back; the experts' result per token is the same either way.
  const int64_t batch = shapeOf(residual)[0], sequence = shapeOf(residual)[1];
  auto swapBatchAndSequence = [&](Value value, int64_t rows, int64_t columns, const std::string& what) {
    auto type = cast<RankedTensorType>(value.getType());
    const int64_t width = type.getShape().back();
    Value grid = g_.reshape(value, {rows, columns, width}, name(what + ".grid"));
    Value swapped = b_.create<TransposeOp>(g_.loc(name(what + ".swap")),
                                           RankedTensorType::get({columns, rows, width}, type.getElementType()), grid,
                                           ArrayRef<int64_t>{1, 0, 2});
    return g_.reshape(swapped, {rows * columns, width}, name(what + ".rows"));
  };
  if (sequenceMajorExpertTokens_) {
    expertNormed = swapBatchAndSequence(expertNormed, batch, sequence, "experts.input");
    routeWeights = swapBatchAndSequence(routeWeights, batch, sequence, "experts.weights");
    routeIndices = swapBatchAndSequence(routeIndices, batch, sequence, "experts.indices");
  }
  Value expertInput = g_.reshape(expertNormed, {tokens, hidden_}, name("experts.tokens"));
  Value gateUp =
      g_.param(name("experts.gate_up_proj"), {config_.numExperts, 2 * config_.moeIntermediateSize, hidden_}, "normal");
  Value down =
      g_.param(name("experts.down_proj"), {config_.numExperts, hidden_, config_.moeIntermediateSize}, "normal");
  Value experts =
      b_.create<MoeExpertsOp>(g_.loc(name("experts")), expertInput, routeWeights, routeIndices, gateUp, down)
          .getResult();
  if (sequenceMajorExpertTokens_) experts = swapBatchAndSequence(experts, sequence, batch, "experts.result");
  Value expertsOut = g_.rmsNorm(g_.reshape(experts, shapeOf(residual), name("experts.out")),
                                name("post_feedforward_layernorm_2.weight"));
  return g_.rmsNorm(g_.add(denseOut, expertsOut, name("ffn.sum")), name("post_feedforward_layernorm.weight"));
}

// Switch-style load balancing (docs/training.md, "Router aux loss", Megatron's definition): E / (k T²) Σ_e P_e c_e over
// the call's T real tokens, with P_e the router probability mass of expert e and c_e its top-k
// count (no gradient: a discrete choice). Padding tokens (tokenValid = 0) do not count: their
// hidden states are never read. A null tokenValid means every token is real (the canvas).
Value TextStack::loadBalancingLoss(int64_t layer, Value routerLogits, Value indices, Value tokenValid) {
  auto name = [&](const std::string& suffix) { return layerName(layer, "aux." + suffix); };
  const int64_t tokens = shapeOf(routerLogits)[0], experts = config_.numExperts, topK = config_.topKExperts;
  Value weight = tokenValid ? g_.castTo(g_.reshape(tokenValid, {tokens, 1}, name("valid")), f32_, name("weight"))
                            : g_.ones({tokens, 1}, name("weight"));
  Value probabilities = b_.create<SoftmaxOp>(g_.loc(name("probs")), routerLogits, b_.getI64IntegerAttr(-1));
  Value mass = g_.reduceSum(g_.mul(probabilities, weight, name("probs.real")), {0}, name("mass"));
  Value choices = g_.reshape(indices, {tokens * topK}, name("choices"));
  Value choiceWeights = g_.reshape(g_.mul(weight, g_.ones({tokens, topK}, name("slots")), name("choice.weight")),
                                   {tokens * topK, 1}, name("choice.weights"));
  Value counts = b_.create<ScatterAddOp>(g_.loc(name("counts")), g_.f32Type({experts, 1}), choices, choiceWeights);
  Value balance =
      g_.reduceSum(g_.mul(mass, g_.reshape(counts, {experts}, name("counts.flat")), name("product")), {0}, name("sum"));
  Value real = g_.maximum(g_.reduceSum(weight, {0, 1}, name("tokens")), g_.scalar(1.0, name("tokens.min")),
                          name("tokens.clamped"));
  Value scale = g_.div(g_.scalar(static_cast<double>(experts) / static_cast<double>(topK), name("e_over_k")),
                       g_.mul(real, real, name("t2")), name("scale"));
  return g_.mul(balance, scale, name("loss"));
}

// docs/model.md, "Layer composition": sandwich norms; layer_scalar scales the whole residual stream.
template <typename KeySet>
Value TextStack::layerForward(int64_t layer, Value hidden, Value positions, const KeySet& keySet,
                              std::vector<LayerKeyValues>* keyValuesOut) {
  auto name = [&](const std::string& suffix) { return layerName(layer, suffix); };
  Value normed = g_.rmsNorm(hidden, name("input_layernorm.weight"));
  Value attended = attention(layer, normed, positions, keySet, keyValuesOut);
  Value residual =
      g_.add(hidden, g_.rmsNorm(attended, name("post_attention_layernorm.weight")), name("attention.residual"));
  // Encoder queries are its keys (padding included); every decoder query is a canvas token.
  Value tokenValid;
  if constexpr (std::is_same_v<KeySet, EncoderAttention>)
    tokenValid = keySet.tokenValid ? keySet.tokenValid : keySet.keyValid;
  Value out = g_.add(residual, feedForward(layer, residual, tokenValid), name("ffn.residual"));
  Value scaled =
      g_.mul(out, g_.param(name("layer_scalar"), {1}, "ones", /*trainable=*/false), name("layer_scalar.apply"));
  // The span dg-recompute may replay from the layer's input (docs/training.md, "Recomputation").
  normed.getDefiningOp()->setAttr(kLayerBeginAttr, b_.getI64IntegerAttr(layer));
  scaled.getDefiningOp()->setAttr(kLayerEndAttr, b_.getI64IntegerAttr(layer));
  return scaled;
}

// docs/model.md, "Head and soft-cap": final norm, tied head (the unscaled embedding), soft-cap c * tanh(x / c) unless
// `capped` is false (a cross-entropy that caps itself). The head's output is widened to f32 (as HF
// casts it) before the soft-cap.
Value TextStack::head(Value x, bool capped) {
  Value normed = g_.rmsNorm(x, g_.param(top("norm.weight"), {hidden_}, "ones"), "decoder.norm");
  Value table = embeddingTable();
  Value logits = withoutVocabularyPadding(
      g_.toF32(b_.create<MatmulOp>(g_.loc("head"), normed, table, b_.getBoolAttr(false), b_.getBoolAttr(true)), "head"),
      "head.unpadded");
  const double cap = config_.finalLogitSoftcapping;
  if (cap <= 0 || !capped) return logits;
  Value squashed = b_.create<TanhOp>(g_.loc("softcap"), g_.div(logits, g_.scalar(cap, "softcap.c"), "softcap.in"));
  return g_.mul(squashed, g_.scalar(cap, "softcap.c"), "softcap.out");
}

}  // namespace mlir::dg::diffusion_gemma
