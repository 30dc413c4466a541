// Sharding rules of the dg ops (ShardingRuleOpInterface), as #dg.sharding_rule attributes.
#include "dialects/dg/IR/DgOps.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

// One dimension's factors, major to minor: a single factor converts implicitly, `{a, b}` is a
// dimension of two factors, and `{}` a size-1 dimension that broadcasts.
struct Dim {
  Dim() = default;
  Dim(int64_t factor) : factors{factor} {}
  Dim(std::initializer_list<int64_t> majorToMinor) : factors(majorToMinor) {}
  SmallVector<int64_t, 2> factors;
};
using Dims = SmallVector<Dim>;

class RuleBuilder {
 public:
  explicit RuleBuilder(MLIRContext* context) : context_(context) {}

  int64_t addFactor(int64_t size, FactorKind kind) {
    sizes_.push_back(size);
    kinds_.push_back(kind);
    return sizes_.size() - 1;
  }
  // A new factor per dimension of `shape`, of the kind `kindOf(dim)` gives.
  Dims addFactors(ArrayRef<int64_t> shape, function_ref<FactorKind(int64_t)> kindOf) {
    Dims dims;
    for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) dims.push_back(addFactor(shape[d], kindOf(d)));
    return dims;
  }
  Dims addPassThrough(ArrayRef<int64_t> shape) {
    return addFactors(shape, [](int64_t) { return FactorKind::PassThrough; });
  }
  void operand(ArrayRef<Dim> dims) { operands_.push_back(tensor(dims)); }
  void result(ArrayRef<Dim> dims) { results_.push_back(tensor(dims)); }
  ShardingRuleAttr take() { return ShardingRuleAttr::get(context_, sizes_, kinds_, operands_, results_); }

 private:
  TensorFactorsAttr tensor(ArrayRef<Dim> dims) {
    SmallVector<DenseI64ArrayAttr> lists;
    for (const Dim& dim : dims) lists.push_back(DenseI64ArrayAttr::get(context_, dim.factors));
    return TensorFactorsAttr::get(context_, lists);
  }

  MLIRContext* context_;
  SmallVector<int64_t> sizes_;
  SmallVector<FactorKind> kinds_;
  SmallVector<TensorFactorsAttr> operands_, results_;
};

// Every dimension of every operand and the result is the same pass-through factor, except the
// dimensions listed in `wholeDims` (result dimensions that must stay whole).
ShardingRuleAttr sameShapeRule(Operation* op, ArrayRef<int64_t> wholeDims = {}) {
  RuleBuilder builder(op->getContext());
  Dims dims = builder.addFactors(shapeOf(op->getResult(0)), [&](int64_t d) {
    return llvm::is_contained(wholeDims, d) ? FactorKind::NeedReplication : FactorKind::PassThrough;
  });
  for (unsigned i = 0; i < op->getNumOperands(); ++i) builder.operand(dims);
  builder.result(dims);
  return builder.take();
}

// Result dimensions as factors; operands align on the right and their broadcast size-1 dims get none.
ShardingRuleAttr broadcastRule(Operation* op) {
  RuleBuilder builder(op->getContext());
  ArrayRef<int64_t> shape = shapeOf(op->getResult(0));
  Dims dims = builder.addPassThrough(shape);
  for (Value operand : op->getOperands()) {
    ArrayRef<int64_t> operandShape = shapeOf(operand);
    size_t lead = shape.size() - operandShape.size();
    Dims operandDims;
    for (size_t d = 0; d < operandShape.size(); ++d)
      operandDims.push_back(operandShape[d] == 1 && shape[lead + d] != 1 ? Dim() : dims[lead + d]);
    builder.operand(operandDims);
  }
  builder.result(dims);
  return builder.take();
}

ShardingRuleAttr reduceRule(Operation* op) {
  RuleBuilder builder(op->getContext());
  auto reduced = op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef();
  auto keepDims = op->getAttrOfType<BoolAttr>("keep_dims");
  Dims input = builder.addFactors(shapeOf(op->getOperand(0)), [&](int64_t d) {
    return llvm::is_contained(reduced, d) ? FactorKind::Reduction : FactorKind::PassThrough;
  });
  Dims result;
  for (int64_t d = 0; d < static_cast<int64_t>(input.size()); ++d) {
    if (!llvm::is_contained(reduced, d)) result.push_back(input[d]);
    else if (keepDims && keepDims.getValue()) result.push_back(Dim());
  }
  builder.operand(input);
  builder.result(result);
  return builder.take();
}

// The result alone, every dimension its own pass-through factor (graph sources).
ShardingRuleAttr sourceRule(Operation* op) {
  RuleBuilder builder(op->getContext());
  Dims dims = builder.addPassThrough(shapeOf(op->getResult(0)));
  for (Value operand : op->getOperands()) builder.operand(Dims(shapeOf(operand).size(), Dim()));
  builder.result(dims);
  return builder.take();
}

}  // namespace

ShardingRuleAttr ParamOp::getShardingRule() { return sourceRule(*this); }
ShardingRuleAttr InputOp::getShardingRule() { return sourceRule(*this); }
ShardingRuleAttr ConstantOp::getShardingRule() { return sourceRule(*this); }
ShardingRuleAttr FillOp::getShardingRule() { return sourceRule(*this); }

ShardingRuleAttr AddOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr SubOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr MulOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr DivOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr MaximumOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr MinimumOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr CompareOp::getShardingRule() { return broadcastRule(*this); }
ShardingRuleAttr SelectOp::getShardingRule() { return broadcastRule(*this); }

ShardingRuleAttr NegOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr ExpOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr LogOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr TanhOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr SqrtOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr RsqrtOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr GeluTanhOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr CastOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr StopGradientOp::getShardingRule() { return sameShapeRule(*this); }

// The leading dimensions are one pass-through factor each in codes, scales and result. int8: the last
// dimension is a pass-through factor of codes and result (each element's scale is its row's, which the
// scales hold whole). nf4: the last dimension is (blocks, within a block), the codes' (blocks, byte
// within a block) and the scales' blocks alone, so a split of it keeps whole blocks on every rank.
ShardingRuleAttr DequantizeOp::getShardingRule() {
  RuleBuilder builder(getContext());
  ArrayRef<int64_t> shape = shapeOf(getResult());
  Dims leading = builder.addPassThrough(shape.drop_back());
  Dims codes = leading, scales = leading, result = leading;
  if (getFormat() == "nf4") {
    constexpr int64_t kBlock = 64;
    int64_t blocks = builder.addFactor(shape.back() / kBlock, FactorKind::PassThrough);
    int64_t bytesInBlock = builder.addFactor(kBlock / 2, FactorKind::NeedReplication);
    int64_t elementsInBlock = builder.addFactor(kBlock, FactorKind::NeedReplication);
    codes.push_back(Dim{blocks, bytesInBlock});
    scales.push_back(blocks);
    result.push_back(Dim{blocks, elementsInBlock});
  } else {
    int64_t row = builder.addFactor(shape.back(), FactorKind::PassThrough);
    codes.push_back(row);
    result.push_back(row);
  }
  builder.operand(codes);
  builder.operand(scales);
  builder.result(result);
  return builder.take();
}

ShardingRuleAttr SoftmaxOp::getShardingRule() {
  int64_t rank = getType().getRank(), axis = getAxisAttr().getInt();
  return sameShapeRule(*this, {axis < 0 ? axis + rank : axis});
}

ShardingRuleAttr RmsNormOp::getShardingRule() {
  // The normalised dimension is reduced inside the op: it has to be whole on each rank.
  RuleBuilder builder(getContext());
  int64_t last = getType().getRank() - 1;
  Dims dims = builder.addFactors(getType().getShape(), [&](int64_t d) {
    return d == last ? FactorKind::NeedReplication : FactorKind::PassThrough;
  });
  builder.operand(dims);
  if (getWeight()) builder.operand({dims.back()});
  builder.result(dims);
  return builder.take();
}

ShardingRuleAttr MatmulOp::getShardingRule() {
  RuleBuilder builder(getContext());
  auto lhsShape = shapeOf(getLhs());
  int64_t lhsRank = lhsShape.size();
  Dims batch = builder.addPassThrough(lhsShape.drop_back(2));
  auto resultShape = shapeOf(getResult());
  int64_t m = builder.addFactor(resultShape[lhsRank - 2], FactorKind::PassThrough);
  int64_t n = builder.addFactor(resultShape[lhsRank - 1], FactorKind::PassThrough);
  int64_t k = builder.addFactor(lhsShape[lhsRank - (getTransposeA() ? 2 : 1)], FactorKind::Reduction);
  Dims lhs(batch), rhs, result(batch);
  lhs.append(getTransposeA() ? Dims{k, m} : Dims{m, k});
  if (shapeOf(getRhs()).size() != 2) rhs.append(batch);
  rhs.append(getTransposeB() ? Dims{n, k} : Dims{k, n});
  result.append({m, n});
  builder.operand(lhs);
  builder.operand(rhs);
  builder.result(result);
  return builder.take();
}

ShardingRuleAttr ReduceSumOp::getShardingRule() { return reduceRule(*this); }
ShardingRuleAttr ReduceMeanOp::getShardingRule() { return reduceRule(*this); }
ShardingRuleAttr ReduceMaxOp::getShardingRule() { return reduceRule(*this); }

ShardingRuleAttr TransposeOp::getShardingRule() {
  RuleBuilder builder(getContext());
  Dims input = builder.addPassThrough(shapeOf(getInput()));
  Dims result;
  for (int64_t p : getPerm()) result.push_back(input[p]);
  builder.operand(input);
  builder.result(result);
  return builder.take();
}

ShardingRuleAttr ReshapeOp::getShardingRule() {
  // Both shapes are products of common factors, found left to right: where one side's dimension
  // divides the other's, it is the major factor of that one ([2, 32] -> [2, 4, 8] makes the 32 the
  // factors (4 8)), so splitting a factor splits both sides alike. Size-1 dimensions have no factor.
  // From the first pair that does not divide ([6, 4] -> [4, 6]) on, each side's dimensions must be
  // whole.
  RuleBuilder builder(getContext());
  auto in = shapeOf(getInput()), out = shapeOf(getResult());
  Dims input(in.size()), result(out.size());
  size_t i = 0, o = 0;
  int64_t inLeft = 0, outLeft = 0;  // what the current dimension still has to be factored into
  auto skipOnes = [&] {
    while (inLeft == 0 && i < in.size() && in[i] == 1) ++i;
    while (outLeft == 0 && o < out.size() && out[o] == 1) ++o;
  };
  for (skipOnes(); i < in.size() && o < out.size(); skipOnes()) {
    if (inLeft == 0) inLeft = in[i];
    if (outLeft == 0) outLeft = out[o];
    int64_t size = std::min(inLeft, outLeft);
    if (size == 0 || std::max(inLeft, outLeft) % size != 0) break;
    int64_t factor = builder.addFactor(size, FactorKind::PassThrough);
    input[i].factors.push_back(factor);
    result[o].factors.push_back(factor);
    inLeft /= size;
    outLeft /= size;
    if (inLeft == 1) inLeft = 0, ++i;
    if (outLeft == 1) outLeft = 0, ++o;
  }
  // Past a mismatch, what is left of each dimension is one whole factor of its own.
  for (; i < in.size(); ++i, inLeft = 0)
    if (in[i] != 1) input[i].factors.push_back(builder.addFactor(inLeft ? inLeft : in[i], FactorKind::NeedReplication));
  for (; o < out.size(); ++o, outLeft = 0)
    if (out[o] != 1)
      result[o].factors.push_back(builder.addFactor(outLeft ? outLeft : out[o], FactorKind::NeedReplication));
  builder.operand(input);
  builder.result(result);
  return builder.take();
}

ShardingRuleAttr ConcatOp::getShardingRule() {
  // Every dimension but the joined one passes through; each input's joined dimension has its own
  // extent, so its own factor, and all of them must be whole.
  RuleBuilder builder(getContext());
  int64_t dim = getDimAttr().getInt();
  Dims result = builder.addFactors(getType().getShape(), [&](int64_t d) {
    return d == dim ? FactorKind::NeedReplication : FactorKind::PassThrough;
  });
  for (Value input : getInputs()) {
    Dims dims(result);
    dims[dim] = builder.addFactor(shapeOf(input)[dim], FactorKind::NeedReplication);
    builder.operand(dims);
  }
  builder.result(result);
  return builder.take();
}

ShardingRuleAttr SliceOp::getShardingRule() {
  // Every dimension but the sliced one passes through; the sliced one must be whole.
  RuleBuilder builder(getContext());
  int64_t dim = getDimAttr().getInt();
  Dims result = builder.addFactors(getType().getShape(), [&](int64_t d) {
    return d == dim ? FactorKind::NeedReplication : FactorKind::PassThrough;
  });
  Dims input(result);
  input[dim] = builder.addFactor(getInput().getType().getDimSize(dim), FactorKind::NeedReplication);
  builder.operand(input);
  builder.result(result);
  return builder.take();
}

ShardingRuleAttr GatherOp::getShardingRule() {
  // Rows of the table are looked up by value, so they must be whole (a vocab-parallel embedding is
  // a separate masked op); id dimensions and the width pass through.
  RuleBuilder builder(getContext());
  auto tableShape = shapeOf(getTable());
  int64_t rows = builder.addFactor(tableShape[0], FactorKind::NeedReplication);
  Dims ids = builder.addPassThrough(shapeOf(getIds()));
  int64_t width = builder.addFactor(tableShape[1], FactorKind::PassThrough);
  builder.operand({rows, width});
  builder.operand(ids);
  Dims result(ids);
  result.push_back(width);
  builder.result(result);
  return builder.take();
}

namespace {
// Element i's value depends on its index within the key's stream: a shard would need an index
// offset, so each stream is drawn whole. With a key per row the rows are separate streams, so rows
// split with their keys. A key's (seed, offset) pair is whole.
ShardingRuleAttr randomRule(Value key, Value result) {
  RuleBuilder builder(key.getContext());
  bool rowKeys = shapeOf(key).size() == 2;
  Dims dims = builder.addFactors(shapeOf(result), [&](int64_t d) {
    return rowKeys && d == 0 ? FactorKind::PassThrough : FactorKind::NeedReplication;
  });
  int64_t keyWords = builder.addFactor(shapeOf(key).back(), FactorKind::NeedReplication);
  if (rowKeys) builder.operand({dims[0], keyWords});
  else builder.operand({keyWords});
  builder.result(dims);
  return builder.take();
}
}  // namespace

ShardingRuleAttr RandomUniformOp::getShardingRule() { return randomRule(getKey(), getResult()); }
ShardingRuleAttr RandomIntOp::getShardingRule() { return randomRule(getKey(), getResult()); }

ShardingRuleAttr RopeOp::getShardingRule() {
  // Batch, tokens and heads pass through; the head dimension's pairs mix its two halves.
  RuleBuilder builder(getContext());
  Dims dims = builder.addFactors(getType().getShape(), [](int64_t d) {
    return d == 3 ? FactorKind::NeedReplication : FactorKind::PassThrough;
  });
  builder.operand(dims);
  builder.operand({dims[0], dims[1]});
  builder.result(dims);
  return builder.take();
}

namespace {

// The factors of attention's q, k, v and key_valid. Query head h reads KV head h / group, so the
// query-head dimension is (kvHeads group): splitting kvHeads n ways gives each rank Hq/n query
// heads and exactly the Hkv/n KV heads they read (head-parallel attention). Splitting the group
// factor too (tensor parallelism beyond the KV heads) gives ranks of one KV head disjoint query
// heads of its group. Keys and the contracted head_dim must be whole, except that the backward's key
// gradients sum over the queries and over the group's query heads.
// Adds the four operands; the output is {batch, queries, (kvHeads group), valueDim}.
struct AttentionFactors {
  int64_t batch, queries, kvHeads, group, headDim, keys, valueDim;
  Dim queryHeads() const { return {kvHeads, group}; }
};
AttentionFactors addAttentionOperands(RuleBuilder& builder, RankedTensorType query, RankedTensorType key,
                                      RankedTensorType value, FactorKind queriesKind, FactorKind groupKind) {
  AttentionFactors f;
  f.batch = builder.addFactor(query.getDimSize(0), FactorKind::PassThrough);
  f.queries = builder.addFactor(query.getDimSize(1), queriesKind);
  f.kvHeads = builder.addFactor(key.getDimSize(2), FactorKind::PassThrough);
  f.group = builder.addFactor(query.getDimSize(2) / key.getDimSize(2), groupKind);
  f.headDim = builder.addFactor(query.getDimSize(3), FactorKind::NeedReplication);
  f.keys = builder.addFactor(key.getDimSize(1), FactorKind::NeedReplication);
  f.valueDim = builder.addFactor(value.getDimSize(3), FactorKind::PassThrough);
  builder.operand({f.batch, f.queries, f.queryHeads(), f.headDim});
  builder.operand({f.batch, f.keys, f.kvHeads, f.headDim});
  builder.operand({f.batch, f.keys, f.kvHeads, f.valueDim});
  builder.operand({f.batch, f.keys});
  return f;
}

// The router's logits [N, E] and per-expert scale [E]; the chosen k must be whole like the experts.
// The backward's scale gradient sums over the tokens.
struct RouteFactors {
  int64_t tokens, experts, chosen;
};
RouteFactors addRouteOperands(RuleBuilder& builder, RankedTensorType logits, int64_t topK, FactorKind tokensKind) {
  RouteFactors f;
  f.tokens = builder.addFactor(logits.getDimSize(0), tokensKind);
  f.experts = builder.addFactor(logits.getDimSize(1), FactorKind::NeedReplication);
  f.chosen = builder.addFactor(topK, FactorKind::NeedReplication);
  builder.operand({f.tokens, f.experts});
  builder.operand({f.experts});
  return f;
}

// The routed experts' x, weights, indices, gate_up and down. gate_up's rows are (halves inner): the
// gate rows, then the up rows, each `inner` long. Expert parallelism (split experts) and split inner
// rows both leave the per-token sums partial; each rank must see both halves. The backward's weight
// gradients sum over the tokens.
struct ExpertFactors {
  int64_t tokens, hidden, chosen, experts, halves, inner;
};
ExpertFactors addExpertOperands(RuleBuilder& builder, RankedTensorType input, RankedTensorType weights,
                                RankedTensorType gateUp, RankedTensorType down, FactorKind tokensKind) {
  ExpertFactors f;
  f.tokens = builder.addFactor(input.getDimSize(0), tokensKind);
  f.hidden = builder.addFactor(input.getDimSize(1), FactorKind::NeedReplication);
  f.chosen = builder.addFactor(weights.getDimSize(1), FactorKind::NeedReplication);
  f.experts = builder.addFactor(gateUp.getDimSize(0), FactorKind::Reduction);
  f.halves = builder.addFactor(2, FactorKind::NeedReplication);
  f.inner = builder.addFactor(down.getDimSize(2), FactorKind::Reduction);
  builder.operand({f.tokens, f.hidden});
  builder.operand({f.tokens, f.chosen});
  builder.operand({f.tokens, f.chosen});
  builder.operand({f.experts, {f.halves, f.inner}, f.hidden});
  builder.operand({f.experts, f.hidden, f.inner});
  return f;
}

// The per-expert adapters split with their experts (dim 0) and the inner dimension as gate_up and
// down do; the rank stays whole. Each call adds an operand or a result per adapter present, in the
// op's order: A1 [E, r, H], B1 [E, 2I, r], A2 [E, r, I], B2 [E, H, r].
template <typename AddTensor>
void addExpertAdapters(RuleBuilder& builder, const ExpertFactors& f, Value gateUpA, Value downA, AddTensor add) {
  Value anyA = gateUpA ? gateUpA : downA;
  if (!anyA) return;
  const int64_t rank =
      builder.addFactor(cast<RankedTensorType>(anyA.getType()).getDimSize(1), FactorKind::NeedReplication);
  if (gateUpA) {
    add({f.experts, rank, f.hidden});
    add({f.experts, {f.halves, f.inner}, rank});
  }
  if (downA) {
    add({f.experts, rank, f.inner});
    add({f.experts, f.hidden, rank});
  }
}

}  // namespace

ShardingRuleAttr AttentionOp::getShardingRule() {
  RuleBuilder builder(getContext());
  AttentionFactors f = addAttentionOperands(builder, getQuery().getType(), getKey().getType(), getValue().getType(),
                                            FactorKind::PassThrough, FactorKind::PassThrough);
  // The image overlay's segment ids and the document ids are laid out like key_valid: each rank needs
  // its rows' whole keys.
  if (getSegmentIds()) builder.operand({f.batch, f.keys});
  if (getDocumentIds()) builder.operand({f.batch, f.keys});
  builder.result({f.batch, f.queries, f.queryHeads(), f.valueDim});
  return builder.take();
}

ShardingRuleAttr AttentionBackwardOp::getShardingRule() {
  // The output gradient is laid out like the output, and dq, dk, dv like q, k, v; dk and dv sum
  // over the queries and the query heads of each KV head's group.
  RuleBuilder builder(getContext());
  AttentionFactors f = addAttentionOperands(builder, getQuery().getType(), getKey().getType(), getValue().getType(),
                                            FactorKind::Reduction, FactorKind::Reduction);
  builder.operand({f.batch, f.queries, f.queryHeads(), f.valueDim});
  if (getSegmentIds()) builder.operand({f.batch, f.keys});
  if (getDocumentIds()) builder.operand({f.batch, f.keys});
  builder.result({f.batch, f.queries, f.queryHeads(), f.headDim});
  builder.result({f.batch, f.keys, f.kvHeads, f.headDim});
  builder.result({f.batch, f.keys, f.kvHeads, f.valueDim});
  return builder.take();
}

ShardingRuleAttr MoeRouteOp::getShardingRule() {
  RuleBuilder builder(getContext());
  RouteFactors f = addRouteOperands(builder, getLogits().getType(), getTopKAttr().getInt(), FactorKind::PassThrough);
  builder.result({f.tokens, f.chosen});
  builder.result({f.tokens, f.chosen});
  return builder.take();
}

ShardingRuleAttr MoeRouteBackwardOp::getShardingRule() {
  RuleBuilder builder(getContext());
  RouteFactors f = addRouteOperands(builder, getLogits().getType(), getTopKAttr().getInt(), FactorKind::Reduction);
  builder.operand({f.tokens, f.chosen});
  builder.operand({f.tokens, f.chosen});
  builder.result({f.tokens, f.experts});
  builder.result({f.experts});
  return builder.take();
}

ShardingRuleAttr MoeExpertsOp::getShardingRule() {
  RuleBuilder builder(getContext());
  ExpertFactors f = addExpertOperands(builder, getInput().getType(), getWeights().getType(), getGateUp().getType(),
                                      getDown().getType(), FactorKind::PassThrough);
  // The adapters' partial products (x A1ᵀ over a split hidden, act A2ᵀ over a split inner) are
  // linear in what follows them, so the output stays a pending sum like the base products'.
  addExpertAdapters(builder, f, getLoraGateUpA(), getLoraDownA(), [&](Dims dims) { builder.operand(dims); });
  builder.result({f.tokens, f.hidden});
  // A route's pre-activations are zero on a block without its expert: partial over the experts too.
  if (getGateUpRows()) builder.result({{f.tokens, f.chosen}, {f.halves, f.inner}});
  return builder.take();
}

ShardingRuleAttr MoeExpertsBackwardOp::getShardingRule() {
  // dx and the routing weights' gradient are partial like the forward's output; the experts' weight
  // gradients stay with their rank.
  RuleBuilder builder(getContext());
  ExpertFactors f = addExpertOperands(builder, getInput().getType(), getWeights().getType(), getGateUp().getType(),
                                      getDown().getType(), FactorKind::Reduction);
  builder.operand({f.tokens, f.hidden});
  if (getGateUpRows()) builder.operand({{f.tokens, f.chosen}, {f.halves, f.inner}});
  addExpertAdapters(builder, f, getLoraGateUpA(), getLoraDownA(), [&](Dims dims) { builder.operand(dims); });
  builder.result({f.tokens, f.hidden});
  builder.result({f.tokens, f.chosen});
  if (getGradGateUp()) builder.result({f.experts, {f.halves, f.inner}, f.hidden});
  if (getGradDown()) builder.result({f.experts, f.hidden, f.inner});
  addExpertAdapters(builder, f, getLoraGateUpA(), getLoraDownA(), [&](Dims dims) { builder.result(dims); });
  return builder.take();
}

ShardingRuleAttr ScatterAddOp::getShardingRule() {
  // Ids and width pass through; rows are addressed by value, so the table is whole, and split ids
  // leave it partial (each rank adds its own rows).
  RuleBuilder builder(getContext());
  auto table = getResult().getType();
  Dims ids = builder.addFactors(getIds().getType().getShape(), [](int64_t) { return FactorKind::Reduction; });
  int64_t rows = builder.addFactor(table.getDimSize(0), FactorKind::NeedReplication);
  int64_t width = builder.addFactor(table.getDimSize(1), FactorKind::PassThrough);
  builder.operand(ids);
  Dims updates(ids);
  updates.push_back(width);
  builder.operand(updates);
  builder.result({rows, width});
  return builder.take();
}

namespace {
// Cross-entropy's logits [..., V] and its per-position operands (targets, bonus ids, bonus, and the
// backward's output gradient): positions pass through, the vocabulary is reduced inside the op and
// must be whole.
struct CrossEntropyFactors {
  Dims positions;
  int64_t vocabulary;
};
CrossEntropyFactors addCrossEntropyOperands(RuleBuilder& builder, Operation* op) {
  ArrayRef<int64_t> logits = shapeOf(op->getOperand(0));
  CrossEntropyFactors f;
  f.positions = builder.addPassThrough(logits.drop_back());
  f.vocabulary = builder.addFactor(logits.back(), FactorKind::NeedReplication);
  Dims logitDims(f.positions);
  logitDims.push_back(f.vocabulary);
  builder.operand(logitDims);
  for (unsigned i = 1; i < op->getNumOperands(); ++i) builder.operand(f.positions);
  return f;
}
}  // namespace

ShardingRuleAttr CrossEntropyOp::getShardingRule() {
  RuleBuilder builder(getContext());
  builder.result(addCrossEntropyOperands(builder, *this).positions);
  return builder.take();
}

ShardingRuleAttr CrossEntropyBackwardOp::getShardingRule() {
  RuleBuilder builder(getContext());
  CrossEntropyFactors f = addCrossEntropyOperands(builder, *this);
  Dims gradient(f.positions);
  gradient.push_back(f.vocabulary);
  builder.result(gradient);
  return builder.take();
}

// Elementwise over the four tensors and the three results; the scalars are replicated.
ShardingRuleAttr AdamwOp::getShardingRule() {
  RuleBuilder builder(getContext());
  Dims dims = builder.addPassThrough(getParam().getType().getShape());
  for (int i = 0; i < 4; ++i) builder.operand(dims);
  for (int i = 0; i < 4; ++i) builder.operand({});
  for (int i = 0; i < 3; ++i) builder.result(dims);
  return builder.take();
}

// The normalised dimension is reduced inside the op and must be whole. The weight's gradient sums
// over every row, so the rows are reduction factors: split rows (sequence parallelism, split heads)
// leave grad_weight a pending sum, while grad_input keeps the rows' split.
ShardingRuleAttr RmsNormBackwardOp::getShardingRule() {
  RuleBuilder builder(getContext());
  int64_t last = getInput().getType().getRank() - 1;
  Dims dims = builder.addFactors(shapeOf(getInput()), [&](int64_t d) {
    return d == last ? FactorKind::NeedReplication : FactorKind::Reduction;
  });
  builder.operand(dims);
  builder.operand(dims);
  if (getWeight()) builder.operand({dims.back()});
  builder.result(dims);
  if (getGradWeight()) builder.result({dims.back()});
  return builder.take();
}

// Collectives. Their group is already one mesh axis; a rule says how another axis may still split
// their operands. Elementwise collectives shard like any elementwise op.
ShardingRuleAttr AllReduceOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr BroadcastOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRuleAttr ReduceToRootOp::getShardingRule() { return sameShapeRule(*this); }

namespace {
// Dim 0 is where the ranks' blocks (or the peers' rows) sit, so it stays whole, as its own factor on
// the input and on the result (their sizes differ); the trailing dims are shared pass-through factors.
Dims blockedRows(RuleBuilder& builder, Value input, Value result, Dims& resultDims) {
  ArrayRef<int64_t> shape = shapeOf(input);
  Dims inputDims{builder.addFactor(shape[0], FactorKind::NeedReplication)};
  resultDims = {builder.addFactor(shapeOf(result)[0], FactorKind::NeedReplication)};
  for (int64_t size : shape.drop_front()) {
    int64_t factor = builder.addFactor(size, FactorKind::PassThrough);
    inputDims.push_back(factor);
    resultDims.push_back(factor);
  }
  return inputDims;
}

ShardingRuleAttr blockedRowsRule(Operation* op) {
  RuleBuilder builder(op->getContext());
  Dims result;
  builder.operand(blockedRows(builder, op->getOperand(0), op->getResult(0), result));
  builder.result(result);
  return builder.take();
}
}  // namespace

ShardingRuleAttr AllGatherOp::getShardingRule() { return blockedRowsRule(*this); }
ShardingRuleAttr ReduceScatterOp::getShardingRule() { return blockedRowsRule(*this); }

// The rows as for all_gather; both count vectors are whole (one factor: one entry per peer).
ShardingRuleAttr AllToAllOp::getShardingRule() {
  RuleBuilder builder(getContext());
  Dims result;
  Dims input = blockedRows(builder, getInput(), getResult(), result);
  int64_t peers = builder.addFactor(getSendCounts().getType().getDimSize(0), FactorKind::NeedReplication);
  builder.operand(input);
  builder.operand({peers});
  builder.result(result);
  builder.result({peers});
  return builder.take();
}

// Expert-parallel dispatch. These ops exist only after partitioning, on one rank's rows: a slot,
// a count or a received row is addressed by its position among all of them, so every such
// dimension stays whole; the hidden dims pass through, and the experts' inner dim may be split
// (a pending sum, as for dg.moe_experts).
namespace {
// Dim 0 of `rows` and of the result (their own whole factors, as their sizes differ), the trailing
// dims shared pass-through factors; slots (and weights) whole.
ShardingRuleAttr permutedRowsRule(Operation* op, Value rows, Value result) {
  RuleBuilder builder(op->getContext());
  Dims resultDims;
  Dims rowDims = blockedRows(builder, rows, result, resultDims);
  Dims slots = builder.addFactors(shapeOf(op->getOperand(1)), [](int64_t) { return FactorKind::NeedReplication; });
  builder.operand(rowDims);
  builder.operand(slots);
  if (op->getNumOperands() > 2) builder.operand(slots);  // dg.moe_combine's weights
  builder.result(resultDims);
  return builder.take();
}

struct LocalExpertFactors {
  int64_t rows, hidden, peers, experts, halves, inner;
};
LocalExpertFactors addLocalExpertFactors(RuleBuilder& builder, RankedTensorType rows, RankedTensorType counts,
                                         RankedTensorType down) {
  LocalExpertFactors f;
  f.rows = builder.addFactor(rows.getDimSize(0), FactorKind::NeedReplication);
  f.hidden = builder.addFactor(rows.getDimSize(1), FactorKind::NeedReplication);
  f.peers = builder.addFactor(counts.getDimSize(0), FactorKind::NeedReplication);
  f.experts = builder.addFactor(counts.getDimSize(1), FactorKind::NeedReplication);
  f.halves = builder.addFactor(2, FactorKind::NeedReplication);
  f.inner = builder.addFactor(down.getDimSize(2), FactorKind::Reduction);
  return f;
}
}  // namespace

ShardingRuleAttr MoeDispatchOp::getShardingRule() {
  RuleBuilder builder(getContext());
  auto whole = [](int64_t) { return FactorKind::NeedReplication; };
  Dims routes = builder.addFactors(shapeOf(getIndices()), whole);
  builder.operand(routes);
  builder.result(routes);
  Dims counts = builder.addFactors(shapeOf(getExpertCounts()), whole);
  builder.result({counts[0]});
  builder.result(counts);
  return builder.take();
}

ShardingRuleAttr MoePermuteOp::getShardingRule() { return permutedRowsRule(*this, getInput(), getResult()); }
ShardingRuleAttr MoeCombineOp::getShardingRule() { return permutedRowsRule(*this, getRows(), getResult()); }

ShardingRuleAttr MoeLocalExpertsOp::getShardingRule() {
  RuleBuilder builder(getContext());
  LocalExpertFactors f = addLocalExpertFactors(builder, getRows().getType(), getExpertCounts().getType(), getDown().getType());
  builder.operand({f.rows, f.hidden});
  builder.operand({f.peers, f.experts});
  builder.operand({f.experts, {f.halves, f.inner}, f.hidden});
  builder.operand({f.experts, f.hidden, f.inner});
  builder.result({f.rows, f.hidden});
  return builder.take();
}

ShardingRuleAttr MoeLocalExpertsBackwardOp::getShardingRule() {
  // The row gradients and the weights' gradients are partial over a split inner dim; the experts'
  // weight gradients split with their weights.
  RuleBuilder builder(getContext());
  LocalExpertFactors f = addLocalExpertFactors(builder, getRows().getType(), getExpertCounts().getType(), getDown().getType());
  builder.operand({f.rows, f.hidden});
  builder.operand({f.rows});
  builder.operand({f.rows, f.hidden});
  builder.operand({f.peers, f.experts});
  builder.operand({f.experts, {f.halves, f.inner}, f.hidden});
  builder.operand({f.experts, f.hidden, f.inner});
  builder.result({f.rows, f.hidden});
  builder.result({f.rows});
  if (getGradGateUp()) builder.result({f.experts, {f.halves, f.inner}, f.hidden});
  if (getGradDown()) builder.result({f.experts, f.hidden, f.inner});
  return builder.take();
}

// The sampler reduces over the whole vocabulary and keys its draws by row and position: every
// dimension stays whole (a vocabulary-parallel sampler would reduce its statistics across ranks).
ShardingRuleAttr CanvasSampleOp::getShardingRule() {
  RuleBuilder builder(getContext());
  auto whole = [](int64_t) { return FactorKind::NeedReplication; };
  Dims logits = builder.addFactors(shapeOf(getLogits()), whole);
  Dim keyWords = builder.addFactor(2, FactorKind::NeedReplication);
  builder.operand(logits);
  builder.operand({logits[0]});
  builder.operand({logits[0], keyWords});
  for (int i = 0; i < 3; ++i) builder.result({logits[0], logits[1]});
  builder.result(logits);
  return builder.take();
}
