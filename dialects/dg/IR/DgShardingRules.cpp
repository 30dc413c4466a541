// Sharding rules of the dg ops (ShardingRuleOpInterface).
#include "dialects/dg/IR/DgOps.h"

using namespace mlir;
using namespace mlir::dg;

using FactorKind = ShardingRule::FactorKind;

std::string ShardingRule::str() const {
  auto factorName = [](int64_t factor) {
    return factor == kNoFactor ? std::string("1") : std::string(1, static_cast<char>('i' + factor));
  };
  auto tensors = [&](const SmallVector<SmallVector<int64_t>>& list) {
    std::string text = "(";
    for (size_t t = 0; t < list.size(); ++t) {
      text += t ? ", [" : "[";
      for (size_t d = 0; d < list[t].size(); ++d) text += (d ? ", " : "") + factorName(list[t][d]);
      text += "]";
    }
    return text + ")";
  };
  std::string text = tensors(operandFactors) + " -> " + tensors(resultFactors);
  for (auto [kind, label] : {std::pair{FactorKind::Reduction, "reduction"}, std::pair{FactorKind::NeedReplication, "need_replication"}}) {
    std::string names;
    for (size_t f = 0; f < factorKinds.size(); ++f)
      if (factorKinds[f] == kind) names += (names.empty() ? "" : ", ") + factorName(f);
    if (!names.empty()) text += std::string(" ") + label + "={" + names + "}";
  }
  return text;
}

namespace {

ArrayRef<int64_t> shapeOf(Value value) { return cast<RankedTensorType>(value.getType()).getShape(); }

// Builds rules whose factors are the result dimensions, with a kind per dimension.
class RuleBuilder {
 public:
  int64_t addFactor(int64_t size, FactorKind kind) {
    rule_.factorSizes.push_back(size);
    rule_.factorKinds.push_back(kind);
    return rule_.factorSizes.size() - 1;
  }
  void operand(SmallVector<int64_t> factors) { rule_.operandFactors.push_back(std::move(factors)); }
  void result(SmallVector<int64_t> factors) { rule_.resultFactors.push_back(std::move(factors)); }
  ShardingRule take() { return std::move(rule_); }

 private:
  ShardingRule rule_;
};

// Every dimension of every operand and the result is the same pass-through factor, except the
// dimensions listed in `wholeDims` (result dimensions that must stay whole).
ShardingRule sameShapeRule(Operation* op, ArrayRef<int64_t> wholeDims = {}) {
  RuleBuilder builder;
  ArrayRef<int64_t> shape = shapeOf(op->getResult(0));
  SmallVector<int64_t> factors;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    factors.push_back(builder.addFactor(shape[d], llvm::is_contained(wholeDims, d) ? FactorKind::NeedReplication
                                                                                   : FactorKind::PassThrough));
  for (Value operand : op->getOperands()) {
    (void)operand;
    builder.operand(factors);
  }
  builder.result(factors);
  return builder.take();
}

// Result dimensions as factors; operands align on the right and their broadcast size-1 dims get none.
ShardingRule broadcastRule(Operation* op) {
  RuleBuilder builder;
  ArrayRef<int64_t> shape = shapeOf(op->getResult(0));
  SmallVector<int64_t> factors;
  for (int64_t size : shape) factors.push_back(builder.addFactor(size, FactorKind::PassThrough));
  for (Value operand : op->getOperands()) {
    ArrayRef<int64_t> operandShape = shapeOf(operand);
    size_t lead = shape.size() - operandShape.size();
    SmallVector<int64_t> operandFactors;
    for (size_t d = 0; d < operandShape.size(); ++d)
      operandFactors.push_back(operandShape[d] == 1 && shape[lead + d] != 1 ? ShardingRule::kNoFactor : factors[lead + d]);
    builder.operand(operandFactors);
  }
  builder.result(factors);
  return builder.take();
}

ShardingRule reduceRule(Operation* op) {
  RuleBuilder builder;
  ArrayRef<int64_t> inputShape = shapeOf(op->getOperand(0));
  auto dims = op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef();
  bool keepDims = op->getAttrOfType<BoolAttr>("keep_dims") && op->getAttrOfType<BoolAttr>("keep_dims").getValue();
  SmallVector<int64_t> inputFactors, resultFactors;
  for (int64_t d = 0; d < static_cast<int64_t>(inputShape.size()); ++d) {
    bool reduced = llvm::is_contained(dims, d);
    int64_t factor = builder.addFactor(inputShape[d], reduced ? FactorKind::Reduction : FactorKind::PassThrough);
    inputFactors.push_back(factor);
    if (!reduced) resultFactors.push_back(factor);
    else if (keepDims) resultFactors.push_back(ShardingRule::kNoFactor);
  }
  builder.operand(inputFactors);
  builder.result(resultFactors);
  return builder.take();
}

// The result alone, every dimension its own pass-through factor (graph sources).
ShardingRule sourceRule(Operation* op) {
  RuleBuilder builder;
  SmallVector<int64_t> factors;
  for (int64_t size : shapeOf(op->getResult(0))) factors.push_back(builder.addFactor(size, FactorKind::PassThrough));
  for (Value operand : op->getOperands())
    builder.operand(SmallVector<int64_t>(shapeOf(operand).size(), ShardingRule::kNoFactor));
  builder.result(factors);
  return builder.take();
}

}  // namespace

ShardingRule ParamOp::getShardingRule() { return sourceRule(*this); }
ShardingRule InputOp::getShardingRule() { return sourceRule(*this); }
ShardingRule ConstantOp::getShardingRule() { return sourceRule(*this); }
ShardingRule FillOp::getShardingRule() { return sourceRule(*this); }

ShardingRule AddOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule SubOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule MulOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule DivOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule MaximumOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule MinimumOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule CompareOp::getShardingRule() { return broadcastRule(*this); }
ShardingRule SelectOp::getShardingRule() { return broadcastRule(*this); }

ShardingRule NegOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule ExpOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule LogOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule TanhOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule SqrtOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule RsqrtOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule GeluTanhOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule CastOp::getShardingRule() { return sameShapeRule(*this); }
ShardingRule StopGradientOp::getShardingRule() { return sameShapeRule(*this); }

ShardingRule SoftmaxOp::getShardingRule() {
  int64_t rank = getType().getRank(), axis = getAxisAttr().getInt();
  return sameShapeRule(*this, {axis < 0 ? axis + rank : axis});
}

ShardingRule RmsNormOp::getShardingRule() {
  // The normalised dimension is reduced inside the op: it has to be whole on each rank.
  ShardingRule rule = sameShapeRule(*this, {getType().getRank() - 1});
  if (getWeight()) rule.operandFactors[1] = {rule.resultFactors[0].back()};
  return rule;
}

ShardingRule MatmulOp::getShardingRule() {
  RuleBuilder builder;
  auto lhsShape = shapeOf(getLhs());
  int64_t lhsRank = lhsShape.size();
  SmallVector<int64_t> batch;
  for (int64_t d = 0; d < lhsRank - 2; ++d) batch.push_back(builder.addFactor(lhsShape[d], FactorKind::PassThrough));
  auto resultShape = shapeOf(getResult());
  int64_t m = builder.addFactor(resultShape[lhsRank - 2], FactorKind::PassThrough);
  int64_t n = builder.addFactor(resultShape[lhsRank - 1], FactorKind::PassThrough);
  int64_t k = builder.addFactor(lhsShape[lhsRank - (getTransposeA() ? 2 : 1)], FactorKind::Reduction);
  SmallVector<int64_t> lhs(batch), rhs, result(batch);
  lhs.append(getTransposeA() ? SmallVector<int64_t>{k, m} : SmallVector<int64_t>{m, k});
  if (shapeOf(getRhs()).size() != 2) rhs.append(batch);
  rhs.append(getTransposeB() ? SmallVector<int64_t>{n, k} : SmallVector<int64_t>{k, n});
  result.append({m, n});
  builder.operand(lhs);
  builder.operand(rhs);
  builder.result(result);
  return builder.take();
}

ShardingRule ReduceSumOp::getShardingRule() { return reduceRule(*this); }
ShardingRule ReduceMeanOp::getShardingRule() { return reduceRule(*this); }
ShardingRule ReduceMaxOp::getShardingRule() { return reduceRule(*this); }

ShardingRule TransposeOp::getShardingRule() {
  RuleBuilder builder;
  SmallVector<int64_t> inputFactors;
  for (int64_t size : shapeOf(getInput())) inputFactors.push_back(builder.addFactor(size, FactorKind::PassThrough));
  SmallVector<int64_t> resultFactors;
  for (int64_t p : getPerm()) resultFactors.push_back(inputFactors[p]);
  builder.operand(inputFactors);
  builder.result(resultFactors);
  return builder.take();
}

ShardingRule ReshapeOp::getShardingRule() {
  // Leading dimensions that the reshape leaves alone pass through; the rest must be whole (a split
  // of a merged or divided dimension is not a block split of the other side).
  RuleBuilder builder;
  auto in = shapeOf(getInput()), out = shapeOf(getResult());
  size_t common = 0;
  while (common < in.size() && common < out.size() && in[common] == out[common]) ++common;
  SmallVector<int64_t> inputFactors, resultFactors;
  for (size_t d = 0; d < common; ++d) {
    int64_t factor = builder.addFactor(in[d], FactorKind::PassThrough);
    inputFactors.push_back(factor);
    resultFactors.push_back(factor);
  }
  for (size_t d = common; d < in.size(); ++d) inputFactors.push_back(builder.addFactor(in[d], FactorKind::NeedReplication));
  for (size_t d = common; d < out.size(); ++d) resultFactors.push_back(builder.addFactor(out[d], FactorKind::NeedReplication));
  builder.operand(inputFactors);
  builder.result(resultFactors);
  return builder.take();
}

ShardingRule ConcatOp::getShardingRule() {
  // Every dimension but the joined one passes through; the joined one must be whole.
  int64_t dim = getDimAttr().getInt();
  ShardingRule rule = sameShapeRule(*this, {dim});
  // Each input's joined dimension has its own extent: give it its own factor.
  for (size_t i = 0; i < rule.operandFactors.size(); ++i) {
    rule.factorSizes.push_back(cast<RankedTensorType>(getInputs()[i].getType()).getDimSize(dim));
    rule.factorKinds.push_back(FactorKind::NeedReplication);
    rule.operandFactors[i][dim] = static_cast<int64_t>(rule.factorSizes.size()) - 1;
  }
  return rule;
}

ShardingRule SliceOp::getShardingRule() {
  // Every dimension but the sliced one passes through; the sliced one must be whole.
  ShardingRule rule = sameShapeRule(*this, {getDimAttr().getInt()});
  int64_t dim = getDimAttr().getInt();
  rule.factorSizes.push_back(getInput().getType().getDimSize(dim));
  rule.factorKinds.push_back(FactorKind::NeedReplication);
  rule.operandFactors[0][dim] = static_cast<int64_t>(rule.factorSizes.size()) - 1;
  return rule;
}

ShardingRule GatherOp::getShardingRule() {
  // Rows of the table are looked up by value, so they must be whole (a vocab-parallel embedding is
  // a separate masked op); id dimensions and the width pass through.
  RuleBuilder builder;
  auto tableShape = shapeOf(getTable());
  int64_t rows = builder.addFactor(tableShape[0], FactorKind::NeedReplication);
  SmallVector<int64_t> idFactors;
  for (int64_t size : shapeOf(getIds())) idFactors.push_back(builder.addFactor(size, FactorKind::PassThrough));
  int64_t width = builder.addFactor(tableShape[1], FactorKind::PassThrough);
  builder.operand({rows, width});
  builder.operand(idFactors);
  SmallVector<int64_t> result(idFactors);
  result.push_back(width);
  builder.result(result);
  return builder.take();
}

namespace {
// Element i's value depends on its index within the key's stream: a shard would need an index
// offset, so each stream is drawn whole. With a key per row the rows are separate streams, so rows
// split with their keys.
ShardingRule randomRule(Value key, Value result) {
  RuleBuilder builder;
  ArrayRef<int64_t> shape = shapeOf(result);
  bool rowKeys = shapeOf(key).size() == 2;
  SmallVector<int64_t> factors;
  for (size_t d = 0; d < shape.size(); ++d)
    factors.push_back(
        builder.addFactor(shape[d], rowKeys && d == 0 ? FactorKind::PassThrough : FactorKind::NeedReplication));
  if (rowKeys) builder.operand({factors[0], ShardingRule::kNoFactor});
  else builder.operand({ShardingRule::kNoFactor});
  builder.result(factors);
  return builder.take();
}
}  // namespace

ShardingRule RandomUniformOp::getShardingRule() { return randomRule(getKey(), getResult()); }
ShardingRule RandomIntOp::getShardingRule() { return randomRule(getKey(), getResult()); }

ShardingRule RopeOp::getShardingRule() {
  // Batch, tokens and heads pass through; the head dimension's pairs mix its two halves.
  ShardingRule rule = sameShapeRule(*this, {3});
  rule.operandFactors[1] = {rule.resultFactors[0][0], rule.resultFactors[0][1]};
  return rule;
}

namespace {

// The factors of attention's q, k, v and key_valid. One factor stands for the key/value heads and,
// through the grouping h / (Hq / Hkv), for the query heads: splitting it n ways gives each rank Hq/n
// query heads and exactly the Hkv/n KV heads they read (head-parallel attention). Keys and the
// contracted head_dim must be whole. Adds the four operands; the output has
// {batch, queries, heads, valueDim}.
struct AttentionFactors {
  int64_t batch, queries, heads, headDim, keys, valueDim;
};
AttentionFactors addAttentionOperands(RuleBuilder& builder, RankedTensorType query, RankedTensorType key,
                                      RankedTensorType value) {
  AttentionFactors f;
  f.batch = builder.addFactor(query.getDimSize(0), FactorKind::PassThrough);
  f.queries = builder.addFactor(query.getDimSize(1), FactorKind::PassThrough);
  f.heads = builder.addFactor(key.getDimSize(2), FactorKind::PassThrough);
  f.headDim = builder.addFactor(query.getDimSize(3), FactorKind::NeedReplication);
  f.keys = builder.addFactor(key.getDimSize(1), FactorKind::NeedReplication);
  f.valueDim = builder.addFactor(value.getDimSize(3), FactorKind::PassThrough);
  builder.operand({f.batch, f.queries, f.heads, f.headDim});
  builder.operand({f.batch, f.keys, f.heads, f.headDim});
  builder.operand({f.batch, f.keys, f.heads, f.valueDim});
  builder.operand({f.batch, f.keys});
  return f;
}

// The router's logits [N, E] and per-expert scale [E]; the chosen k must be whole like the experts.
struct RouteFactors {
  int64_t tokens, experts, chosen;
};
RouteFactors addRouteOperands(RuleBuilder& builder, RankedTensorType logits, int64_t topK) {
  RouteFactors f;
  f.tokens = builder.addFactor(logits.getDimSize(0), FactorKind::PassThrough);
  f.experts = builder.addFactor(logits.getDimSize(1), FactorKind::NeedReplication);
  f.chosen = builder.addFactor(topK, FactorKind::NeedReplication);
  builder.operand({f.tokens, f.experts});
  builder.operand({f.experts});
  return f;
}

// The routed experts' x, weights, indices, gate_up and down. Expert parallelism: each rank runs its
// experts, so per-token sums become partial.
struct ExpertFactors {
  int64_t tokens, hidden, chosen, experts, gateUpRows, inner;
};
ExpertFactors addExpertOperands(RuleBuilder& builder, RankedTensorType input, RankedTensorType weights,
                                RankedTensorType gateUp, RankedTensorType down) {
  ExpertFactors f;
  f.tokens = builder.addFactor(input.getDimSize(0), FactorKind::PassThrough);
  f.hidden = builder.addFactor(input.getDimSize(1), FactorKind::NeedReplication);
  f.chosen = builder.addFactor(weights.getDimSize(1), FactorKind::NeedReplication);
  f.experts = builder.addFactor(gateUp.getDimSize(0), FactorKind::Reduction);
  f.gateUpRows = builder.addFactor(gateUp.getDimSize(1), FactorKind::NeedReplication);
  f.inner = builder.addFactor(down.getDimSize(2), FactorKind::NeedReplication);
  builder.operand({f.tokens, f.hidden});
  builder.operand({f.tokens, f.chosen});
  builder.operand({f.tokens, f.chosen});
  builder.operand({f.experts, f.gateUpRows, f.hidden});
  builder.operand({f.experts, f.hidden, f.inner});
  return f;
}

}  // namespace

ShardingRule AttentionOp::getShardingRule() {
  RuleBuilder builder;
  AttentionFactors f = addAttentionOperands(builder, getQuery().getType(), getKey().getType(), getValue().getType());
  builder.result({f.batch, f.queries, f.heads, f.valueDim});
  return builder.take();
}

ShardingRule AttentionBackwardOp::getShardingRule() {
  // The output gradient is laid out like the output, and dq, dk, dv like q, k, v.
  RuleBuilder builder;
  AttentionFactors f = addAttentionOperands(builder, getQuery().getType(), getKey().getType(), getValue().getType());
  builder.operand({f.batch, f.queries, f.heads, f.valueDim});
  builder.result({f.batch, f.queries, f.heads, f.headDim});
  builder.result({f.batch, f.keys, f.heads, f.headDim});
  builder.result({f.batch, f.keys, f.heads, f.valueDim});
  return builder.take();
}

ShardingRule MoeRouteOp::getShardingRule() {
  RuleBuilder builder;
  RouteFactors f = addRouteOperands(builder, getLogits().getType(), getTopKAttr().getInt());
  builder.result({f.tokens, f.chosen});
  builder.result({f.tokens, f.chosen});
  return builder.take();
}

ShardingRule MoeRouteBackwardOp::getShardingRule() {
  RuleBuilder builder;
  RouteFactors f = addRouteOperands(builder, getLogits().getType(), getTopKAttr().getInt());
  builder.operand({f.tokens, f.chosen});
  builder.operand({f.tokens, f.chosen});
  builder.result({f.tokens, f.experts});
  builder.result({f.experts});  // summed over tokens: partial when tokens are split
  return builder.take();
}

ShardingRule MoeExpertsOp::getShardingRule() {
  RuleBuilder builder;
  ExpertFactors f = addExpertOperands(builder, getInput().getType(), getWeights().getType(), getGateUp().getType(),
                                      getDown().getType());
  builder.result({f.tokens, f.hidden});
  return builder.take();
}

ShardingRule MoeExpertsBackwardOp::getShardingRule() {
  // dx is partial like the forward's output; the experts' weight gradients stay with their rank.
  RuleBuilder builder;
  ExpertFactors f = addExpertOperands(builder, getInput().getType(), getWeights().getType(), getGateUp().getType(),
                                      getDown().getType());
  builder.operand({f.tokens, f.hidden});
  builder.result({f.tokens, f.hidden});
  builder.result({f.tokens, f.chosen});
  builder.result({f.experts, f.gateUpRows, f.hidden});
  builder.result({f.experts, f.hidden, f.inner});
  return builder.take();
}

ShardingRule ScatterAddOp::getShardingRule() {
  // Ids and width pass through; rows are addressed by value, so the table is whole, and split ids
  // leave it partial (each rank adds its own rows).
  RuleBuilder builder;
  auto table = getResult().getType();
  SmallVector<int64_t> idFactors;
  for (int64_t size : getIds().getType().getShape()) idFactors.push_back(builder.addFactor(size, FactorKind::Reduction));
  int64_t rows = builder.addFactor(table.getDimSize(0), FactorKind::NeedReplication);
  int64_t width = builder.addFactor(table.getDimSize(1), FactorKind::PassThrough);
  builder.operand(idFactors);
  SmallVector<int64_t> updates(idFactors);
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
  SmallVector<int64_t> positions;
  int64_t vocabulary;
};
CrossEntropyFactors addCrossEntropyOperands(RuleBuilder& builder, Operation* op) {
  ArrayRef<int64_t> logits = shapeOf(op->getOperand(0));
  CrossEntropyFactors f;
  for (int64_t size : logits.drop_back()) f.positions.push_back(builder.addFactor(size, FactorKind::PassThrough));
  f.vocabulary = builder.addFactor(logits.back(), FactorKind::NeedReplication);
  SmallVector<int64_t> logitFactors(f.positions);
  logitFactors.push_back(f.vocabulary);
  builder.operand(logitFactors);
  for (unsigned i = 1; i < op->getNumOperands(); ++i) builder.operand(f.positions);
  return f;
}
}  // namespace

ShardingRule CrossEntropyOp::getShardingRule() {
  RuleBuilder builder;
  builder.result(addCrossEntropyOperands(builder, *this).positions);
  return builder.take();
}

ShardingRule CrossEntropyBackwardOp::getShardingRule() {
  RuleBuilder builder;
  CrossEntropyFactors f = addCrossEntropyOperands(builder, *this);
  SmallVector<int64_t> gradient(f.positions);
  gradient.push_back(f.vocabulary);
  builder.result(gradient);
  return builder.take();
}

// Elementwise over the four tensors and the three results; the scalars are replicated.
ShardingRule AdamwOp::getShardingRule() {
  RuleBuilder builder;
  SmallVector<int64_t> factors;
  for (int64_t size : getParam().getType().getShape()) factors.push_back(builder.addFactor(size, FactorKind::PassThrough));
  for (int i = 0; i < 4; ++i) builder.operand(factors);
  for (int i = 0; i < 4; ++i) builder.operand({});
  for (int i = 0; i < 3; ++i) builder.result(factors);
  return builder.take();
}

// The normalised dimension is reduced inside the op, and the weight's gradient sums over every row:
// both need their dimensions whole. (A rule whose rows make grad_weight a pending sum would let
// sequence parallelism keep rows split; the sharding passes do not use this op yet.)
ShardingRule RmsNormBackwardOp::getShardingRule() {
  RuleBuilder builder;
  ArrayRef<int64_t> shape = shapeOf(getInput());
  SmallVector<int64_t> factors;
  for (int64_t size : shape) factors.push_back(builder.addFactor(size, FactorKind::NeedReplication));
  builder.operand(factors);
  builder.operand(factors);
  if (getWeight()) builder.operand({factors.back()});
  builder.result(factors);
  if (getGradWeight()) builder.result({factors.back()});
  return builder.take();
}
