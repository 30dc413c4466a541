// Verifiers of the model-level ops (rope, attention, MoE routing and experts) and the losses.
#include "dialects/dg/IR/DgOps.h"

using namespace mlir;
using namespace mlir::dg;

namespace {
RankedTensorType typeOf(Value value) { return cast<RankedTensorType>(value.getType()); }
}  // namespace

LogicalResult RopeOp::verify() {
  auto input = getInput().getType();
  if (input.getRank() != 4) return emitOpError() << "input must be [batch, tokens, heads, head_dim], got " << input;
  int64_t headDim = input.getDimSize(3);
  if (headDim % 2 != 0) return emitOpError() << "head_dim " << headDim << " must be even (rotate-half pairs)";
  auto positions = getPositions().getType();
  if (positions.getShape() != input.getShape().take_front(2))
    return emitOpError() << "positions must be [" << input.getDimSize(0) << ", " << input.getDimSize(1) << "], got " << positions;
  int64_t pairs = getRotatedPairsAttr().getInt();
  if (pairs < 1 || pairs > headDim / 2)
    return emitOpError() << "rotated_pairs " << pairs << " must be in [1, " << headDim / 2 << "]";
  if (getFrequencyDimAttr().getInt() < 1) return emitOpError() << "frequency_dim must be >= 1";
  if (getTheta().convertToDouble() <= 0) return emitOpError() << "theta must be > 0";
  if (getResult().getType() != input) return emitOpError() << "result type must equal the input type";
  return success();
}

namespace {
// The geometry and mask rules shared by dg.attention and dg.attention_backward; `output` has the
// attention output's type (the result, or the output gradient); `segmentIds` and `documentIds` may be null.
LogicalResult verifyAttention(Operation* op, Value queryValue, Value keyValue, Value valueValue, Value keyValid,
                              Value segmentIds, Value documentIds, RankedTensorType output, AttentionMask mask,
                              int64_t window, int64_t prefixLength, std::optional<uint64_t> trailingKeys) {
  auto query = typeOf(queryValue), key = typeOf(keyValue), value = typeOf(valueValue);
  if (query.getRank() != 4 || key.getRank() != 4 || value.getRank() != 4)
    return op->emitOpError() << "query, key and value must be [batch, tokens, heads, head_dim]";
  if (query.getElementType() != key.getElementType() || query.getElementType() != value.getElementType() ||
      query.getElementType() != output.getElementType())
    return op->emitOpError() << "query, key, value and result must share the element type";
  int64_t batch = query.getDimSize(0), queries = query.getDimSize(1), queryHeads = query.getDimSize(2);
  int64_t keys = key.getDimSize(1), kvHeads = key.getDimSize(2);
  if (key.getDimSize(0) != batch || value.getDimSize(0) != batch) return op->emitOpError() << "batch sizes differ";
  if (value.getDimSize(1) != keys || value.getDimSize(2) != kvHeads)
    return op->emitOpError() << "value must have the key's tokens and heads, got " << value << " for key " << key;
  if (key.getDimSize(3) != query.getDimSize(3))
    return op->emitOpError() << "query and key head_dim differ: " << query.getDimSize(3) << " vs " << key.getDimSize(3);
  if (kvHeads < 1 || queryHeads % kvHeads != 0)
    return op->emitOpError() << "query heads (" << queryHeads << ") must be a multiple of key/value heads (" << kvHeads << ")";
  if (typeOf(keyValid).getShape() != ArrayRef<int64_t>{batch, keys})
    return op->emitOpError() << "key_valid must be [" << batch << ", " << keys << "]";
  SmallVector<int64_t> expected{batch, queries, queryHeads, value.getDimSize(3)};
  if (output.getShape() != ArrayRef<int64_t>(expected))
    return op->emitOpError() << "result must be " << RankedTensorType::get(expected, query.getElementType());

  if (window < 0) return op->emitOpError() << "window must be >= 0";
  if (trailingKeys) {
    const int64_t trailing = static_cast<int64_t>(*trailingKeys);
    if (trailing < 0 || (trailing > 0 && queries + trailing > keys))
      return op->emitOpError() << "trailing_keys " << trailing << " must be in [0, " << keys - queries
                               << "] (the queries' positions lie inside the keys)";
  }
  if (mask == AttentionMask::Causal && queries > keys)
    return op->emitOpError() << "a causal mask needs at least as many keys as queries (queries are the last positions)";
  if (mask == AttentionMask::Bidirectional && window > 0 && queries > keys)
    return op->emitOpError() << "a bidirectional mask with a window needs at least as many keys as queries (the "
                                "window is centred on the query's key position)";
  if (mask == AttentionMask::Prefix && (prefixLength < 0 || prefixLength > keys))
    return op->emitOpError() << "prefix_len " << prefixLength << " must be in [0, " << keys << "]";
  if (mask != AttentionMask::Prefix && prefixLength != 0) return op->emitOpError() << "prefix_len is only meaningful with mask = prefix";
  if (segmentIds) {
    if (mask != AttentionMask::Causal)
      return op->emitOpError() << "segment_ids overlay the causal mask only, got mask = " << stringifyAttentionMask(mask);
    if (typeOf(segmentIds).getShape() != ArrayRef<int64_t>{batch, keys})
      return op->emitOpError() << "segment_ids must be [" << batch << ", " << keys << "], got " << typeOf(segmentIds);
  }
  if (documentIds) {
    if (typeOf(documentIds).getShape() != ArrayRef<int64_t>{batch, keys})
      return op->emitOpError() << "document_ids must be [" << batch << ", " << keys << "], got " << typeOf(documentIds);
    if (queries > keys)
      return op->emitOpError() << "document_ids need at least as many keys as queries (a query's document is that of "
                                  "its key position)";
  }
  return success();
}
}  // namespace

LogicalResult AttentionOp::verify() {
  return verifyAttention(*this, getQuery(), getKey(), getValue(), getKeyValid(), getSegmentIds(), getDocumentIds(),
                         getResult().getType(), getMask(), getWindowAttr().getInt(), getPrefixLenAttr().getInt(),
                         getTrailingKeys());
}

LogicalResult AttentionBackwardOp::verify() {
  if (failed(verifyAttention(*this, getQuery(), getKey(), getValue(), getKeyValid(), getSegmentIds(), getDocumentIds(),
                             getGradOutput().getType(), getMask(), getWindowAttr().getInt(),
                             getPrefixLenAttr().getInt(), getTrailingKeys())))
    return failure();
  if (getGradQuery().getType() != getQuery().getType() || getGradKey().getType() != getKey().getType() ||
      getGradValue().getType() != getValue().getType())
    return emitOpError() << "gradients must have the types of query, key and value";
  return success();
}

LogicalResult MoeRouteOp::verify() {
  auto logits = getLogits().getType();
  if (logits.getRank() != 2) return emitOpError() << "logits must be [tokens, experts]";
  int64_t tokens = logits.getDimSize(0), experts = logits.getDimSize(1);
  int64_t topK = getTopKAttr().getInt();
  if (topK < 1 || topK > experts) return emitOpError() << "top_k " << topK << " must be in [1, " << experts << "]";
  if (getPerExpertScale().getType() != RankedTensorType::get({experts}, logits.getElementType()))
    return emitOpError() << "per_expert_scale must be " << RankedTensorType::get({experts}, logits.getElementType());
  if (getWeights().getType() != RankedTensorType::get({tokens, topK}, logits.getElementType()) ||
      getIndices().getType().getShape() != ArrayRef<int64_t>{tokens, topK})
    return emitOpError() << "results must be weights and indices of shape [" << tokens << ", " << topK << "]";
  return success();
}

namespace {
// dg.moe_experts' pre-activations, where present: [N·k, 2I] in the precision the experts compute
// in, the input's element type or f32 for a 16-bit input.
LogicalResult verifyGateUpRows(Operation* op, Value rows, RankedTensorType weights, RankedTensorType input,
                               int64_t inner) {
  if (!rows) return success();
  auto expected = RankedTensorType::get({weights.getDimSize(0) * weights.getDimSize(1), 2 * inner},
                                        gateUpRowsElementType(input.getElementType()));
  if (rows.getType() != expected)
    return op->emitOpError() << "gate_up_rows must be " << expected << " (a row of gate and up per route), got "
                             << rows.getType();
  return success();
}
}  // namespace

namespace {
// The per-expert LoRA adapters of dg.moe_experts and its backward: each pair present has the
// experts of gate_up and down ([E, r, H] and [E, 2I, r] for gate_up, [E, r, I] and [E, H, r] for
// down), x's element type, and one rank r shared by both pairs; lora_scale comes with them.
LogicalResult verifyExpertAdapters(Operation* op, RankedTensorType input, RankedTensorType gateUp, Value gateUpA,
                                   Value gateUpB, Value downA, Value downB, std::optional<APFloat> scale) {
  const int64_t experts = gateUp.getDimSize(0), width = gateUp.getDimSize(1), hidden = gateUp.getDimSize(2);
  const int64_t inner = width / 2;
  std::optional<int64_t> rank;
  auto checkPair = [&](StringRef name, Value a, Value b, int64_t fanIn, int64_t fanOut) -> LogicalResult {
    if (!a) return success();
    auto aType = typeOf(a), bType = typeOf(b);
    if (aType.getRank() != 3 || aType.getDimSize(0) != experts || aType.getDimSize(2) != fanIn)
      return op->emitOpError() << name << " A must be [" << experts << ", rank, " << fanIn << "], got " << aType;
    const int64_t r = aType.getDimSize(1);
    if (r < 1) return op->emitOpError() << name << " rank must be >= 1, got " << r;
    auto expectedB = RankedTensorType::get({experts, fanOut, r}, input.getElementType());
    if (bType != expectedB) return op->emitOpError() << name << " B must be " << expectedB << ", got " << bType;
    if (aType.getElementType() != input.getElementType())
      return op->emitOpError() << name << " A must have the input's element type " << input.getElementType() << ", got "
                               << aType;
    if (rank && *rank != r)
      return op->emitOpError() << "lora_gate_up and lora_down must share one rank, got " << *rank << " and " << r;
    rank = r;
    return success();
  };
  if (failed(checkPair("lora_gate_up", gateUpA, gateUpB, hidden, width)) ||
      failed(checkPair("lora_down", downA, downB, inner, hidden)))
    return failure();
  const bool adapters = gateUpA || downA;
  if (adapters != scale.has_value())
    return op->emitOpError() << (adapters ? "adapters need lora_scale (alpha / rank)"
                                          : "lora_scale is given without an adapter");
  if (scale && !scale->isFinite()) return op->emitOpError() << "lora_scale must be finite";
  return success();
}
}  // namespace

LogicalResult MoeExpertsOp::verify() {
  auto input = getInput().getType(), gateUp = getGateUp().getType(), down = getDown().getType();
  if (input.getRank() != 2 || gateUp.getRank() != 3 || down.getRank() != 3)
    return emitOpError() << "input must be [tokens, hidden], gate_up [experts, 2*inner, hidden], down [experts, hidden, inner]";
  int64_t tokens = input.getDimSize(0), hidden = input.getDimSize(1);
  int64_t experts = gateUp.getDimSize(0), inner = gateUp.getDimSize(1) / 2;
  if (gateUp.getDimSize(1) % 2 != 0 || gateUp.getDimSize(2) != hidden)
    return emitOpError() << "gate_up must be [experts, 2*inner, " << hidden << "], got " << gateUp;
  if (down.getShape() != ArrayRef<int64_t>{experts, hidden, inner})
    return emitOpError() << "down must be " << RankedTensorType::get({experts, hidden, inner}, input.getElementType());
  auto weights = getWeights().getType();
  if (weights.getRank() != 2 || weights.getDimSize(0) != tokens || getIndices().getType().getShape() != weights.getShape())
    return emitOpError() << "weights and indices must both be [" << tokens << ", top_k]";
  for (Value operand : {getGateUp(), getDown()})
    if (typeOf(operand).getElementType() != input.getElementType())
      return emitOpError() << "gate_up and down must have the input's element type";
  // Routing weights may stay f32 under bf16 activations (the router is an fp32 island; the combine
  // accumulates in f32).
  Type weightElement = weights.getElementType();
  if (weightElement != input.getElementType() && !weightElement.isF32())
    return emitOpError() << "weights must be f32 or have the input's element type, got " << weightElement;
  if (getResult().getType() != input) return emitOpError() << "result type must equal the input type";
  if (failed(verifyGateUpRows(*this, getGateUpRows(), weights, input, inner))) return failure();
  if (int64_t offset = getExpertOffset().getInt(); offset < 0)
    return emitOpError() << "expert_offset " << offset << " must be >= 0";
  return verifyExpertAdapters(*this, input, gateUp, getLoraGateUpA(), getLoraGateUpB(), getLoraDownA(), getLoraDownB(),
                              getLoraScale());
}

// The operands are those of the dg.moe_experts whose derivative rule builds this op, whose verifier
// checked them; the offset is what the partitioner sets per rank, the pre-activations what
// dg-keep-expert-activations hands over from the forward.
LogicalResult MoeExpertsBackwardOp::verify() {
  if (int64_t offset = getExpertOffset().getInt(); offset < 0)
    return emitOpError() << "expert_offset " << offset << " must be >= 0";
  if (failed(verifyGateUpRows(*this, getGateUpRows(), getWeights().getType(), getInput().getType(),
                              getDown().getType().getDimSize(2))) ||
      failed(verifyExpertAdapters(*this, getInput().getType(), getGateUp().getType(), getLoraGateUpA(),
                                  getLoraGateUpB(), getLoraDownA(), getLoraDownB(), getLoraScale())))
    return failure();
  // Each gradient has its operand's shape, in its element type or f32 (an f32 accumulation of a
  // 16-bit step's weight gradient); an adapter's gradients come exactly with the adapter.
  auto checkGradient = [&](StringRef name, Value gradient, Value operand) -> LogicalResult {
    if (!gradient) return success();
    auto expected = typeOf(operand), got = typeOf(gradient);
    if (got.getShape() != expected.getShape() ||
        (got.getElementType() != expected.getElementType() && !got.getElementType().isF32()))
      return emitOpError() << name << " must be " << expected << " (or its f32 form), got " << got;
    return success();
  };
  auto checkAdapterGradients = [&](StringRef name, Value a, Value b, Value gradA, Value gradB) -> LogicalResult {
    if (static_cast<bool>(a) != static_cast<bool>(gradA))
      return emitOpError() << "grad_" << name << " must come exactly with the " << name << " adapter";
    if (failed(checkGradient(("grad_" + name + " A").str(), gradA, a))) return failure();
    return checkGradient(("grad_" + name + " B").str(), gradB, b);
  };
  if (failed(checkGradient("grad_gate_up", getGradGateUp(), getGateUp())) ||
      failed(checkGradient("grad_down", getGradDown(), getDown())) ||
      failed(checkAdapterGradients("lora_gate_up", getLoraGateUpA(), getLoraGateUpB(), getGradLoraGateUpA(),
                                   getGradLoraGateUpB())) ||
      failed(
          checkAdapterGradients("lora_down", getLoraDownA(), getLoraDownB(), getGradLoraDownA(), getGradLoraDownB())))
    return failure();
  return success();
}

namespace {
// A frozen base's gradients (grad_gate_up, grad_down) that nothing reads are dropped, so the kernel
// neither computes nor allocates them: autodiff builds the whole backward and leaves the cotangents
// of non-trainable operands unused.
struct DropUnusedBaseGradients : OpRewritePattern<MoeExpertsBackwardOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MoeExpertsBackwardOp op, PatternRewriter& rewriter) const override {
    auto unused = [](Value gradient) { return gradient && gradient.use_empty(); };
    if (!unused(op.getGradGateUp()) && !unused(op.getGradDown())) return failure();
    auto keptType = [&](Value gradient) { return gradient && !gradient.use_empty() ? gradient.getType() : Type(); };
    auto typeOrNull = [](Value value) { return value ? value.getType() : Type(); };
    auto rebuilt = rewriter.create<MoeExpertsBackwardOp>(
        op.getLoc(), op.getGradInput().getType(), op.getGradWeights().getType(), keptType(op.getGradGateUp()),
        keptType(op.getGradDown()), typeOrNull(op.getGradLoraGateUpA()), typeOrNull(op.getGradLoraGateUpB()),
        typeOrNull(op.getGradLoraDownA()), typeOrNull(op.getGradLoraDownB()), op.getInput(), op.getWeights(),
        op.getIndices(), op.getGateUp(), op.getDown(), op.getGradOutput(), op.getGateUpRows(), op.getLoraGateUpA(),
        op.getLoraGateUpB(), op.getLoraDownA(), op.getLoraDownB(), op.getExpertOffsetAttr(), op.getLoraScaleAttr());
    rebuilt->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    auto replace = [&](Value old, Value replacement) {
      if (old && replacement) rewriter.replaceAllUsesWith(old, replacement);
    };
    replace(op.getGradInput(), rebuilt.getGradInput());
    replace(op.getGradWeights(), rebuilt.getGradWeights());
    replace(op.getGradGateUp(), rebuilt.getGradGateUp());
    replace(op.getGradDown(), rebuilt.getGradDown());
    replace(op.getGradLoraGateUpA(), rebuilt.getGradLoraGateUpA());
    replace(op.getGradLoraGateUpB(), rebuilt.getGradLoraGateUpB());
    replace(op.getGradLoraDownA(), rebuilt.getGradLoraDownA());
    replace(op.getGradLoraDownB(), rebuilt.getGradLoraDownB());
    rewriter.eraseOp(op);
    return success();
  }
};
}  // namespace

void MoeExpertsBackwardOp::getCanonicalizationPatterns(RewritePatternSet& patterns, MLIRContext* context) {
  patterns.add<DropUnusedBaseGradients>(context);
}

namespace {
// dg.moe_local_experts_backward's twin of DropUnusedBaseGradients.
struct DropUnusedLocalBaseGradients : OpRewritePattern<MoeLocalExpertsBackwardOp> {
  using OpRewritePattern::OpRewritePattern;
  LogicalResult matchAndRewrite(MoeLocalExpertsBackwardOp op, PatternRewriter& rewriter) const override {
    auto unused = [](Value gradient) { return gradient && gradient.use_empty(); };
    if (!unused(op.getGradGateUp()) && !unused(op.getGradDown())) return failure();
    auto keptType = [&](Value gradient) { return gradient && !gradient.use_empty() ? gradient.getType() : Type(); };
    auto rebuilt = rewriter.create<MoeLocalExpertsBackwardOp>(
        op.getLoc(), op.getGradRows().getType(), op.getGradWeights().getType(), keptType(op.getGradGateUp()),
        keptType(op.getGradDown()), op.getRows(), op.getWeights(), op.getGradOutput(), op.getExpertCounts(),
        op.getGateUp(), op.getDown());
    rebuilt->setDiscardableAttrs(op->getDiscardableAttrDictionary());
    rewriter.replaceAllUsesWith(op.getGradRows(), rebuilt.getGradRows());
    rewriter.replaceAllUsesWith(op.getGradWeights(), rebuilt.getGradWeights());
    if (rebuilt.getGradGateUp()) rewriter.replaceAllUsesWith(op.getGradGateUp(), rebuilt.getGradGateUp());
    if (rebuilt.getGradDown()) rewriter.replaceAllUsesWith(op.getGradDown(), rebuilt.getGradDown());
    rewriter.eraseOp(op);
    return success();
  }
};
}  // namespace

void MoeLocalExpertsBackwardOp::getCanonicalizationPatterns(RewritePatternSet& patterns, MLIRContext* context) {
  patterns.add<DropUnusedLocalBaseGradients>(context);
}

namespace {
// The operand rules shared by dg.cross_entropy and dg.cross_entropy_backward: logits [..., V], and
// targets, bonus_ids and bonus of shape [...]; `perPosition` (named `role`) holds one value per
// position: the loss, or its gradient.
LogicalResult verifyCrossEntropy(Operation* op, Value logitsValue, Value targets, Value bonusIds, Value bonus,
                                 RankedTensorType perPosition, StringRef role) {
  auto logits = typeOf(logitsValue);
  if (logits.getRank() < 1) return op->emitOpError() << "logits need rank >= 1 (the last dimension is the vocabulary)";
  auto positions = RankedTensorType::get(logits.getShape().drop_back(), logits.getElementType());
  if (typeOf(targets).getShape() != positions.getShape())
    return op->emitOpError() << "targets must have the logits' shape without the last dimension, "
                             << RankedTensorType::get(positions.getShape(), typeOf(targets).getElementType()) << ", got "
                             << targets.getType();
  if (static_cast<bool>(bonusIds) != static_cast<bool>(bonus))
    return op->emitOpError() << "bonus_ids and bonus come together or not at all";
  if (bonusIds && typeOf(bonusIds).getShape() != positions.getShape())
    return op->emitOpError() << "bonus_ids must have the targets' shape, got " << bonusIds.getType();
  if (bonus && bonus.getType() != positions)
    return op->emitOpError() << "bonus must be " << positions << ", got " << bonus.getType();
  if (perPosition != positions) return op->emitOpError() << role << " must be " << positions << ", got " << perPosition;
  return success();
}
}  // namespace

LogicalResult CrossEntropyOp::verify() {
  if (!(getSoftcap().convertToDouble() >= 0)) return emitOpError() << "softcap must be >= 0 (0: none)";
  return verifyCrossEntropy(*this, getLogits(), getTargets(), getBonusIds(), getBonus(), getResult().getType(), "result");
}

LogicalResult CrossEntropyBackwardOp::verify() {
  if (!(getSoftcap().convertToDouble() >= 0)) return emitOpError() << "softcap must be >= 0 (0: none)";
  if (failed(verifyCrossEntropy(*this, getLogits(), getTargets(), getBonusIds(), getBonus(), getGradOutput().getType(),
                                "grad_output")))
    return failure();
  if (getGradLogits().getType() != getLogits().getType()) return emitOpError() << "grad_logits must have the logits' type";
  return success();
}

//===----------------------------------------------------------------------===//
// Expert-parallel dispatch
//===----------------------------------------------------------------------===//

LogicalResult MoeDispatchOp::verify() {
  auto indices = getIndices().getType();
  if (indices.getRank() != 2) return emitOpError() << "indices must be [tokens, top_k], got " << indices;
  if (getSlots().getType() != indices) return emitOpError() << "slots must be " << indices << " (one per route)";
  auto sendCounts = getSendCounts().getType();
  if (sendCounts.getRank() != 1 || sendCounts.getDimSize(0) < 1)
    return emitOpError() << "send_counts must be [peers] with at least one peer, got " << sendCounts;
  int64_t peers = sendCounts.getDimSize(0), experts = getNumExperts();
  if (experts < 1 || experts % peers != 0)
    return emitOpError() << "num_experts " << experts << " must be a positive multiple of the " << peers << " peers";
  auto expected = RankedTensorType::get({peers, experts / peers}, sendCounts.getElementType());
  if (getExpertCounts().getType() != expected)
    return emitOpError() << "expert_counts must be " << expected << " (peers, experts per peer), got "
                         << getExpertCounts().getType();
  return success();
}

namespace {
// slots `[M, k]`, the table of routes between M tokens (or routes) and their M·k permuted rows.
FailureOr<std::pair<int64_t, int64_t>> verifySlots(Operation* op, Value slots) {
  auto type = typeOf(slots);
  if (type.getRank() != 2) {
    op->emitOpError() << "slots must be [tokens, top_k], got " << type;
    return failure();
  }
  return std::pair{type.getDimSize(0), type.getDimSize(1)};
}

// `shape` with dim 0 replaced by `rows`.
RankedTensorType withRows(RankedTensorType type, int64_t rows) {
  SmallVector<int64_t> shape(type.getShape());
  shape[0] = rows;
  return RankedTensorType::get(shape, type.getElementType());
}

// Routing weights stay f32 under 16-bit activations (the router is an fp32 island), as for
// dg.moe_experts.
bool isRoutingWeightElement(Type weight, Type rows) {
  return weight == rows || (weight.isF32() && isa<FloatType>(rows) && rows.getIntOrFloatBitWidth() == 16);
}

// The local experts' operands shared by dg.moe_local_experts and its backward: rows [C, H],
// expert_counts [G, E_l], gate_up [E_l, 2I, H] and down [E_l, H, I], one float element type.
LogicalResult verifyLocalExperts(Operation* op, Value rowsValue, Value countsValue, Value gateUpValue, Value downValue) {
  auto rows = typeOf(rowsValue), counts = typeOf(countsValue), gateUp = typeOf(gateUpValue), down = typeOf(downValue);
  if (rows.getRank() != 2 || gateUp.getRank() != 3 || down.getRank() != 3)
    return op->emitOpError() << "rows must be [rows, hidden], gate_up [experts, 2*inner, hidden], down [experts, hidden, inner]";
  int64_t hidden = rows.getDimSize(1), experts = gateUp.getDimSize(0), inner = gateUp.getDimSize(1) / 2;
  if (gateUp.getDimSize(1) % 2 != 0 || gateUp.getDimSize(2) != hidden)
    return op->emitOpError() << "gate_up must be [experts, 2*inner, " << hidden << "], got " << gateUp;
  if (down.getShape() != ArrayRef<int64_t>{experts, hidden, inner})
    return op->emitOpError() << "down must be " << RankedTensorType::get({experts, hidden, inner}, rows.getElementType());
  if (counts.getRank() != 2 || counts.getDimSize(1) != experts || counts.getDimSize(0) < 1)
    return op->emitOpError() << "expert_counts must be [peers, " << experts << "] (one count per source peer and local expert), got "
                             << counts;
  if (gateUp.getElementType() != rows.getElementType() || down.getElementType() != rows.getElementType())
    return op->emitOpError() << "gate_up and down must have the rows' element type";
  return success();
}
}  // namespace

LogicalResult MoePermuteOp::verify() {
  auto slots = verifySlots(*this, getSlots());
  if (failed(slots)) return failure();
  auto [tokens, topK] = *slots;
  auto input = getInput().getType();
  if (input.getRank() < 1 || input.getDimSize(0) != tokens)
    return emitOpError() << "input must have " << tokens << " rows (one per row of slots), got " << input;
  RankedTensorType expected = withRows(input, tokens * topK);
  if (getResult().getType() != expected) return emitOpError() << "result must be " << expected << ", got " << getResult().getType();
  return success();
}

LogicalResult MoeCombineOp::verify() {
  auto slots = verifySlots(*this, getSlots());
  if (failed(slots)) return failure();
  auto [tokens, topK] = *slots;
  auto rows = getRows().getType();
  if (rows.getRank() < 1 || rows.getDimSize(0) != tokens * topK)
    return emitOpError() << "rows must have " << tokens * topK << " rows (one per slot), got " << rows;
  if (Value weights = getWeights()) {
    auto type = typeOf(weights);
    if (type.getShape() != ArrayRef<int64_t>{tokens, topK} || !isRoutingWeightElement(type.getElementType(), rows.getElementType()))
      return emitOpError() << "weights must be [" << tokens << ", " << topK << "] of the rows' element type (or f32 for 16-bit rows), got " << type;
  }
  RankedTensorType expected = withRows(rows, tokens);
  if (getResult().getType() != expected) return emitOpError() << "result must be " << expected << ", got " << getResult().getType();
  return success();
}

LogicalResult MoeLocalExpertsOp::verify() {
  if (failed(verifyLocalExperts(*this, getRows(), getExpertCounts(), getGateUp(), getDown()))) return failure();
  if (getResult().getType() != getRows().getType()) return emitOpError() << "result type must equal the rows' type";
  return success();
}

LogicalResult MoeLocalExpertsBackwardOp::verify() {
  if (failed(verifyLocalExperts(*this, getRows(), getExpertCounts(), getGateUp(), getDown()))) return failure();
  auto rows = getRows().getType(), weights = getWeights().getType();
  if (weights.getShape() != rows.getShape().take_front() || !isRoutingWeightElement(weights.getElementType(), rows.getElementType()))
    return emitOpError() << "weights must be [" << rows.getDimSize(0) << "] (one per row) of the rows' element type (or f32 for 16-bit rows), got "
                         << weights;
  if (getGradOutput().getType() != rows || getGradRows().getType() != rows)
    return emitOpError() << "grad_output and grad_rows must have the rows' type " << rows;
  if (getGradWeights().getType() != weights) return emitOpError() << "grad_weights must have the weights' type " << weights;
  for (auto [gradient, weight] : {std::pair{getGradGateUp(), getGateUp()}, std::pair{getGradDown(), getDown()}}) {
    if (!gradient) continue;  // a frozen base's
    auto gradientType = typeOf(gradient), weightType = typeOf(weight);
    if (gradientType.getShape() != weightType.getShape() ||
        !isWideningResult(weightType.getElementType(), gradientType.getElementType()))
      return emitOpError() << "expert weight gradients must have their weights' shape, in their element type or f32";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Generation
//===----------------------------------------------------------------------===//

LogicalResult CanvasSampleOp::verify() {
  auto logits = getLogits().getType();
  if (logits.getRank() != 3) return emitOpError() << "logits must be [batch, canvas, vocab], got " << logits;
  int64_t batch = logits.getDimSize(0), canvas = logits.getDimSize(1), vocab = logits.getDimSize(2);
  if (vocab < 1) return emitOpError() << "the vocabulary must not be empty";
  if (!(getSoftcap().convertToDouble() >= 0)) return emitOpError() << "softcap must be >= 0 (0: none)";
  auto temperature = getTemperature().getType();
  if (temperature.getShape() != ArrayRef<int64_t>{batch})
    return emitOpError() << "temperature must be [" << batch << "] (one per row), got " << temperature;
  auto key = getKey().getType();
  if (key.getShape() != ArrayRef<int64_t>{batch, 2})
    return emitOpError() << "key must be [" << batch << ", 2] (seed, offset per row), got " << key;
  auto positions = [&](Type element) { return RankedTensorType::get({batch, canvas}, element); };
  Type i64 = IntegerType::get(getContext(), 64);
  if (getSampled().getType() != positions(i64) || getArgmax().getType() != positions(i64))
    return emitOpError() << "sampled and argmax must be " << positions(i64);
  if (getEntropy().getType() != positions(logits.getElementType()))
    return emitOpError() << "entropy must be " << positions(logits.getElementType()) << ", got " << getEntropy().getType();
  auto scaled = getScaled().getType();
  if (scaled.getShape() != logits.getShape())
    return emitOpError() << "scaled must have the logits' shape [" << batch << ", " << canvas << ", " << vocab << "], got "
                         << scaled;
  return success();
}
