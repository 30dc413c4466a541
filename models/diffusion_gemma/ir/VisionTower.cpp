#include "models/diffusion_gemma/ir/VisionTower.h"

#include <cmath>

#include "models/diffusion_gemma/spec/Interface.h"

namespace mlir::dg::diffusion_gemma {

using namespace ::dgemma::diffusion_gemma;

std::vector<std::pair<StringRef, int64_t>> imageTwinBucket(ArrayRef<std::pair<StringRef, int64_t>> textBucket,
                                                           const dgemma::DiffusionGemmaConfig& config,
                                                           int64_t imagesPerExample) {
  std::vector<std::pair<StringRef, int64_t>> bucket(textBucket.begin(), textBucket.end());
  bucket.emplace_back("images_per_example", imagesPerExample);
  bucket.emplace_back("image_patches", config.imagePatches());
  return bucket;
}

VisionTower::VisionTower(GraphBuilder& graph, int64_t imagesPerExample)
    : g_(graph), b_(graph.builder()), vision_(graph.config().vision), images_(graph.batch() * imagesPerExample),
      patches_(graph.config().imagePatches()), softTokens_(graph.config().maxSoftTokensPerImage),
      hidden_(graph.config().vision.hiddenSize) {}

ImageInputs VisionTower::declareInputs(int64_t promptLength) {
  Type i64 = b_.getI64Type();
  const int64_t batch = g_.batch();
  ImageInputs inputs;
  inputs.pixelValues = g_.input(kPixelValues, {images_, patches_, vision_.patchDim()}, g_.f32());
  inputs.positionIds = g_.input(kImagePositionIds, {images_, patches_, 2}, i64);
  inputs.poolSlot = g_.input(kImagePoolSlot, {images_, patches_}, i64);
  inputs.tokenIndex = g_.input(kImageTokenIndex, {batch, promptLength}, i64);
  inputs.segmentIds = g_.input(kImageSegmentIds, {batch, promptLength}, i64);
  return inputs;
}

// The vision config's eps, not the text one (the vision RMS norms and the projector's pre-norm).
Value VisionTower::norm(Value x, Value weight, const std::string& name) {
  return b_.create<RmsNormOp>(g_.loc(name), x, weight, b_.getF64FloatAttr(vision_.rmsNormEps));
}

Value VisionTower::norm(Value x, const std::string& weightName) {
  return norm(x, g_.param(weightName, {shapeOf(x).back()}, "ones"), weightName);
}

Value VisionTower::linear(Value x, const std::string& weightName, int64_t out, int64_t in) {
  return g_.linear(x, g_.param(weightName, {out, in}, "normal"), weightName);
}

Value VisionTower::idsAsF32(Value ids, const std::string& name) { return g_.castTo(ids, g_.f32(), name); }

// docs/model.md, "Rotary embedding" (vision): the first half of each head rotates by the patch's
// column, the second by its row, each with the rotate-half rule over its own D/2 dims and
// frequencies theta^(-2i / (D/2)).
Value VisionTower::rope2d(Value x, Value positionsX, Value positionsY, const std::string& name) {
  const int64_t half = vision_.headDim / 2;
  auto rotate = [&](Value part, Value positions, const std::string& suffix) -> Value {
    return b_.create<RopeOp>(g_.loc(name + suffix), part, positions, b_.getF64FloatAttr(vision_.ropeTheta),
                             b_.getI64IntegerAttr(half / 2), b_.getI64IntegerAttr(half), b_.getBoolAttr(false));
  };
  Value byColumn = rotate(g_.slice(x, 3, 0, half, name + ".x"), positionsX, ".rope_x");
  Value byRow = rotate(g_.slice(x, 3, half, half, name + ".y"), positionsY, ".rope_y");
  return g_.concat({byColumn, byRow}, 3, name + ".rope");
}

// One encoder layer: sandwich norms around bidirectional attention (padding patches masked as
// keys, scale 1, q/k norms with weights, weightless v norm) and the gated gelu_tanh MLP.
Value VisionTower::layer(int64_t index, Value hidden, Value positionsX, Value positionsY, Value patchValid) {
  auto name = [&](const std::string& suffix) { return towerName("encoder.layers." + std::to_string(index) + "." + suffix); };
  const int64_t heads = vision_.numAttentionHeads, kvHeads = vision_.numKeyValueHeads, headDim = vision_.headDim;
  const int64_t inner = vision_.intermediateSize;
  auto split = [&](Value x, int64_t count, const std::string& what) {
    return g_.reshape(x, {images_, patches_, count, headDim}, name(what));
  };

  Value normed = norm(hidden, name("input_layernorm.weight"));
  Value queries = split(linear(normed, name("self_attn.q_proj.linear.weight"), heads * headDim, hidden_), heads, "q");
  queries = rope2d(norm(queries, name("self_attn.q_norm.weight")), positionsX, positionsY, name("q"));
  Value keys = split(linear(normed, name("self_attn.k_proj.linear.weight"), kvHeads * headDim, hidden_), kvHeads, "k");
  keys = rope2d(norm(keys, name("self_attn.k_norm.weight")), positionsX, positionsY, name("k"));
  Value values = split(linear(normed, name("self_attn.v_proj.linear.weight"), kvHeads * headDim, hidden_), kvHeads, "v");
  values = norm(values, Value(), name("self_attn.v_norm"));
  Value attended = b_.create<AttentionOp>(g_.loc(name("attention")), queries, keys, values, patchValid,
                                          AttentionMaskAttr::get(b_.getContext(), AttentionMask::Bidirectional),
                                          b_.getI64IntegerAttr(0), b_.getI64IntegerAttr(0), b_.getF64FloatAttr(1.0),
                                          /*segment_ids=*/Value(), /*document_ids=*/Value());
  Value merged = g_.reshape(attended, {images_, patches_, heads * headDim}, name("heads"));
  Value projected = linear(merged, name("self_attn.o_proj.linear.weight"), hidden_, heads * headDim);
  Value residual = g_.add(hidden, norm(projected, name("post_attention_layernorm.weight")), name("attention.residual"));

  Value mlpInput = norm(residual, name("pre_feedforward_layernorm.weight"));
  Value gate = linear(mlpInput, name("mlp.gate_proj.linear.weight"), inner, hidden_);
  Value up = linear(mlpInput, name("mlp.up_proj.linear.weight"), inner, hidden_);
  Value activated = b_.create<GeluTanhOp>(g_.loc(name("mlp.act")), gate);
  Value down = linear(g_.mul(activated, up, name("mlp.gated")), name("mlp.down_proj.linear.weight"), hidden_, inner);
  return g_.add(residual, norm(down, name("post_feedforward_layernorm.weight")), name("ffn.residual"));
}

// docs/model.md, "Vision tower and projector".
Value VisionTower::features(const ImageInputs& inputs) {
  Type i64 = b_.getI64Type();
  // Patch coordinates [N, N_p] each. Padding patches (-1, -1) look up row 0 and rotate by 0: their
  // rows are masked as keys and dropped by the pooling, so nothing reads what they compute.
  auto coordinate = [&](int64_t which, const std::string& name) {
    Value column = g_.reshape(g_.slice(inputs.positionIds, 2, which, 1, name), {images_, patches_}, name);
    Value negative = g_.compare(idsAsF32(column, name), g_.scalar(0.0, name + ".zero"), ComparePredicate::Lt, name + ".padding");
    auto zeroType = RankedTensorType::get({images_, patches_}, i64);
    Value zero = b_.create<ConstantOp>(g_.loc(name + ".origin"), DenseElementsAttr::get(zeroType, int64_t{0}));
    return b_.create<SelectOp>(g_.loc(name + ".clamped"), negative, zero, column).getResult();
  };
  Value positionsX = coordinate(0, "vision.position_x"), positionsY = coordinate(1, "vision.position_y");
  Value patchValid = g_.compare(idsAsF32(inputs.poolSlot, "vision.pool_slot"),
                                g_.scalar(static_cast<double>(pooledRows()), "vision.no_slot"), ComparePredicate::Lt,
                                "vision.patch_valid");

  // x = (2 (pixels - 0.5)) W_patch^T + PE[0][x] + PE[1][y]: [0, 1] mapped to [-1, 1] in f32.
  Value centred = g_.mul(g_.sub(inputs.pixelValues, g_.scalar(0.5, "vision.half"), "vision.pixels.centred"),
                         g_.scalar(2.0, "vision.two"), "vision.pixels.scaled");
  Value hidden = linear(g_.toActivation(centred, "vision.pixels"), towerName("patch_embedder.input_proj.weight"), hidden_,
                        vision_.patchDim());
  const std::string tableName = towerName("patch_embedder.position_embedding_table");
  Value tables = g_.param(tableName, {2, vision_.positionEmbeddingSize, hidden_}, "normal");
  auto lookup = [&](int64_t axis, Value positions, const std::string& name) -> Value {
    Value table = g_.reshape(g_.slice(tables, 0, axis, 1, name + ".table"), {vision_.positionEmbeddingSize, hidden_},
                             name + ".table");
    return b_.create<GatherOp>(g_.loc(name), table, positions, IntegerAttr());
  };
  Value positionEmbedding = g_.add(lookup(0, positionsX, "vision.pe_x"), lookup(1, positionsY, "vision.pe_y"), "vision.pe");
  hidden = g_.add(hidden, positionEmbedding, "vision.embedded");

  for (int64_t index = 0; index < vision_.numHiddenLayers; ++index)
    hidden = layer(index, hidden, positionsX, positionsY, patchValid);

  // k×k average pooling: every valid patch added into its slot (padding dropped), in f32, then
  // (1/k²)·√Hv. HF rounds the average to the activation dtype before the f32 scaling.
  const double kernelArea = static_cast<double>(vision_.poolingKernelSize * vision_.poolingKernelSize);
  Value summed = b_.create<ScatterAddOp>(g_.loc("vision.pool"), g_.f32Type({pooledRows(), hidden_}), inputs.poolSlot, hidden);
  Value pooled = g_.mul(summed, g_.scalar(1.0 / kernelArea, "vision.pool.area"), "vision.pool.mean");
  if (g_.mixedPrecision()) pooled = g_.toF32(g_.toActivation(pooled, "vision.pool.mean"), "vision.pool.mean");
  pooled = g_.mul(pooled, g_.scalar(std::sqrt(static_cast<double>(hidden_)), "vision.pool.root"), "vision.pool.scaled");
  // Standardization in f32 with the buffers (loaded, never trained).
  if (vision_.standardize) {
    Value bias = g_.toF32(g_.param(towerName("std_bias"), {hidden_}, "zeros", /*trainable=*/false), "vision.std_bias");
    Value scale = g_.toF32(g_.param(towerName("std_scale"), {hidden_}, "ones", /*trainable=*/false), "vision.std_scale");
    pooled = g_.mul(g_.sub(pooled, bias, "vision.std.centred"), scale, "vision.std");
  }
  // The projector: weightless norm, then Hv -> H.
  Value normed = norm(g_.toActivation(pooled, "vision.pooled"), Value(), "vision.projector.norm");
  return linear(normed, projectionName(), g_.config().hiddenSize, hidden_);
}

Value VisionTower::overlaySegmentIds(Value segmentIds) const {
  return g_.config().imageTokensBidirectional ? segmentIds : Value();
}

// docs/model.md, "Image entries": x = E[ids]·s·(1 − is_image) + features[tokenIndex], with a zero
// row for an index out of range. The placeholder's own embedding is multiplied by 0 rather than
// looked up as the pad id: the forward is the same, and so is the gradient (no lookup of either
// row receives any).
Value VisionTower::mergedEmbedding(TextStack& text, Value ids, Value features, Value tokenIndex) {
  const int64_t batch = shapeOf(ids)[0], length = shapeOf(ids)[1];
  Value tokens = text.embed(ids);
  Value isText = g_.compare(idsAsF32(tokenIndex, "merge.index"), g_.scalar(static_cast<double>(pooledRows()), "merge.no_row"),
                            ComparePredicate::Ge, "merge.is_text");
  Value keep = g_.reshape(g_.castTo(isText, g_.activation(), "merge.keep"), {batch, length, 1}, "merge.keep");
  Value imageRows = b_.create<GatherOp>(g_.loc("merge.features"), features, tokenIndex, IntegerAttr());
  return g_.add(g_.mul(tokens, keep, "merge.text"), imageRows, "merge.embedding");
}

}  // namespace mlir::dg::diffusion_gemma
