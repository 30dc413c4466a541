// Result types of the dg ops whose results follow from their operands (InferTypeOpInterface), so
// that builders need not state them. The verifier runs each op's own checks first, so its messages
// stay the ones users see; inference still fails cleanly on operands a builder got wrong.
#include "dialects/dg/IR/DgOps.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

RankedTensorType rankedType(Value value) { return value ? dyn_cast<RankedTensorType>(value.getType()) : nullptr; }

LogicalResult notRanked(std::optional<Location> location, StringRef op) {
  return emitOptionalError(location, "'dg.", op, "' needs ranked tensor operands to infer its result types");
}

// One result per value in `sources`, each of that value's type.
LogicalResult inferSameTypesAs(std::optional<Location> location, ValueRange sources, StringRef op,
                               SmallVectorImpl<Type>& inferred) {
  for (Value source : sources) {
    auto type = rankedType(source);
    if (!type) return notRanked(location, op);
    inferred.push_back(type);
  }
  return success();
}

}  // namespace

LogicalResult mlir::dg::inferBroadcastType(std::optional<Location> location, ValueRange operands, Value elementOf,
                                           SmallVectorImpl<Type>& inferred) {
  for (Value operand : operands)
    if (!rankedType(operand)) return emitOptionalError(location, "broadcasting needs ranked tensor operands");
  FailureOr<SmallVector<int64_t>> shape = broadcastShapeOf(operands.getTypes());
  if (failed(shape)) return emitOptionalError(location, "operand shapes do not broadcast");
  auto element = rankedType(elementOf);
  if (!element) return emitOptionalError(location, "broadcasting needs ranked tensor operands");
  inferred.push_back(RankedTensorType::get(*shape, element.getElementType()));
  return success();
}

LogicalResult mlir::dg::inferReduceType(std::optional<Location> location, Value input, ArrayRef<int64_t> dims,
                                        bool keepDims, SmallVectorImpl<Type>& inferred) {
  auto type = rankedType(input);
  if (!type) return emitOptionalError(location, "a reduction needs a ranked tensor input");
  inferred.push_back(RankedTensorType::get(reducedShape(type.getShape(), dims, keepDims), type.getElementType()));
  return success();
}

bool mlir::dg::isSameOrWidened(TypeRange inferred, TypeRange actual) {
  if (inferred.size() != actual.size()) return false;
  for (auto [expected, got] : llvm::zip(inferred, actual)) {
    auto expectedTensor = dyn_cast<RankedTensorType>(expected), gotTensor = dyn_cast<RankedTensorType>(got);
    if (!expectedTensor || !gotTensor || expectedTensor.getShape() != gotTensor.getShape() ||
        !isWideningResult(expectedTensor.getElementType(), gotTensor.getElementType()))
      return false;
  }
  return true;
}

LogicalResult CompareOp::inferReturnTypes(MLIRContext* context, std::optional<Location> location, Adaptor adaptor,
                                          SmallVectorImpl<Type>& inferred) {
  SmallVector<Type> broadcast;
  if (failed(inferBroadcastType(location, adaptor.getOperands(), adaptor.getLhs(), broadcast))) return failure();
  inferred.push_back(RankedTensorType::get(cast<RankedTensorType>(broadcast[0]).getShape(), IntegerType::get(context, 1)));
  return success();
}

LogicalResult SelectOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                         SmallVectorImpl<Type>& inferred) {
  return inferBroadcastType(location, adaptor.getOperands(), adaptor.getOnTrue(), inferred);
}

LogicalResult MatmulOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                         SmallVectorImpl<Type>& inferred) {
  auto lhs = rankedType(adaptor.getLhs()), rhs = rankedType(adaptor.getRhs());
  if (!lhs || !rhs) return notRanked(location, "matmul");
  if (lhs.getRank() < 2 || rhs.getRank() < 2) return emitOptionalError(location, "'dg.matmul' operands need rank >= 2");
  int64_t lhsRank = lhs.getRank(), rhsRank = rhs.getRank();
  SmallVector<int64_t> shape(lhs.getShape().drop_back(2));
  shape.push_back(lhs.getDimSize(lhsRank - (adaptor.getTransposeA() ? 1 : 2)));
  shape.push_back(rhs.getDimSize(rhsRank - (adaptor.getTransposeB() ? 2 : 1)));
  inferred.push_back(RankedTensorType::get(shape, lhs.getElementType()));
  return success();
}

// An f32 result for 16-bit operands is allowed (dg-f32-gradient-accumulation).
bool MatmulOp::isCompatibleReturnTypes(TypeRange inferred, TypeRange actual) { return isSameOrWidened(inferred, actual); }

LogicalResult RmsNormOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                          SmallVectorImpl<Type>& inferred) {
  return inferSameTypesAs(location, adaptor.getInput(), "rms_norm", inferred);
}

LogicalResult TransposeOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                            SmallVectorImpl<Type>& inferred) {
  auto input = rankedType(adaptor.getInput());
  if (!input) return notRanked(location, "transpose");
  SmallVector<int64_t> shape;
  for (int64_t p : adaptor.getPerm()) {
    if (p < 0 || p >= input.getRank()) return emitOptionalError(location, "'dg.transpose' perm entry ", p, " is out of range");
    shape.push_back(input.getDimSize(p));
  }
  inferred.push_back(RankedTensorType::get(shape, input.getElementType()));
  return success();
}

LogicalResult ConcatOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                         SmallVectorImpl<Type>& inferred) {
  if (adaptor.getInputs().empty()) return emitOptionalError(location, "'dg.concat' needs at least one input");
  auto first = rankedType(adaptor.getInputs().front());
  if (!first) return notRanked(location, "concat");
  int64_t dim = adaptor.getDimAttr().getInt();
  if (dim < 0 || dim >= first.getRank()) return emitOptionalError(location, "'dg.concat' dim ", dim, " is out of range");
  SmallVector<int64_t> shape(first.getShape());
  shape[dim] = 0;
  for (Value input : adaptor.getInputs()) {
    auto type = rankedType(input);
    if (!type || type.getRank() != first.getRank()) return emitOptionalError(location, "'dg.concat' inputs differ in rank");
    shape[dim] += type.getDimSize(dim);
  }
  inferred.push_back(RankedTensorType::get(shape, first.getElementType()));
  return success();
}

LogicalResult GatherOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                         SmallVectorImpl<Type>& inferred) {
  auto table = rankedType(adaptor.getTable()), ids = rankedType(adaptor.getIds());
  if (!table || !ids) return notRanked(location, "gather");
  if (table.getRank() != 2) return emitOptionalError(location, "'dg.gather' table must be 2-D [rows, width]");
  SmallVector<int64_t> shape(ids.getShape());
  shape.push_back(table.getDimSize(1));
  inferred.push_back(RankedTensorType::get(shape, table.getElementType()));
  return success();
}

LogicalResult RopeOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                       SmallVectorImpl<Type>& inferred) {
  return inferSameTypesAs(location, adaptor.getInput(), "rope", inferred);
}

namespace {
// Attention's output [B, Tq, Hq, Dv] in the query's element type.
LogicalResult inferAttentionOutput(std::optional<Location> location, Value queryValue, Value valueValue,
                                   SmallVectorImpl<Type>& inferred) {
  auto query = rankedType(queryValue), value = rankedType(valueValue);
  if (!query || !value) return notRanked(location, "attention");
  if (query.getRank() != 4 || value.getRank() != 4)
    return emitOptionalError(location, "'dg.attention' query and value must be [batch, tokens, heads, head_dim]");
  inferred.push_back(RankedTensorType::get({query.getDimSize(0), query.getDimSize(1), query.getDimSize(2), value.getDimSize(3)},
                                           query.getElementType()));
  return success();
}
}  // namespace

LogicalResult AttentionOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                            SmallVectorImpl<Type>& inferred) {
  return inferAttentionOutput(location, adaptor.getQuery(), adaptor.getValue(), inferred);
}

// dq, dk and dv have the types of q, k and v.
LogicalResult AttentionBackwardOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                                    SmallVectorImpl<Type>& inferred) {
  return inferSameTypesAs(location, {adaptor.getQuery(), adaptor.getKey(), adaptor.getValue()}, "attention_backward",
                          inferred);
}

// weights [N, k] in the logits' element type, indices [N, k] i64.
LogicalResult MoeRouteOp::inferReturnTypes(MLIRContext* context, std::optional<Location> location, Adaptor adaptor,
                                           SmallVectorImpl<Type>& inferred) {
  auto logits = rankedType(adaptor.getLogits());
  if (!logits) return notRanked(location, "moe_route");
  if (logits.getRank() != 2) return emitOptionalError(location, "'dg.moe_route' logits must be [tokens, experts]");
  SmallVector<int64_t> shape{logits.getDimSize(0), adaptor.getTopKAttr().getInt()};
  inferred.push_back(RankedTensorType::get(shape, logits.getElementType()));
  inferred.push_back(RankedTensorType::get(shape, IntegerType::get(context, 64)));
  return success();
}

// One loss per position: the logits' shape without the vocabulary, in their element type.
LogicalResult CrossEntropyOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                               SmallVectorImpl<Type>& inferred) {
  auto logits = rankedType(adaptor.getLogits());
  if (!logits) return notRanked(location, "cross_entropy");
  if (logits.getRank() < 1) return emitOptionalError(location, "'dg.cross_entropy' logits need rank >= 1");
  inferred.push_back(RankedTensorType::get(logits.getShape().drop_back(), logits.getElementType()));
  return success();
}

LogicalResult CrossEntropyBackwardOp::inferReturnTypes(MLIRContext*, std::optional<Location> location, Adaptor adaptor,
                                                       SmallVectorImpl<Type>& inferred) {
  return inferSameTypesAs(location, adaptor.getLogits(), "cross_entropy_backward", inferred);
}
