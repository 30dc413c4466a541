// Vector-Jacobian products of the dg ops (DerivativeOpInterface). Each rule builds the operand
// cotangents from the result cotangent with dg ops, so the backward graph is ordinary IR that every
// later pass (sharding, fusion, memory planning) sees.
#include "dialects/dg/IR/DgOps.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

RankedTensorType typeOf(Value value) { return cast<RankedTensorType>(value.getType()); }

Value scalar(OpBuilder& builder, Location loc, Type elementType, double value) {
  return builder.create<FillOp>(loc, RankedTensorType::get({}, elementType), builder.getF64FloatAttr(value));
}

Value mul(OpBuilder& builder, Location loc, Value a, Value b) {
  auto shape = *broadcastShapes(typeOf(a).getShape(), typeOf(b).getShape());
  return builder.create<MulOp>(loc, RankedTensorType::get(shape, typeOf(a).getElementType()), a, b);
}
Value sub(OpBuilder& builder, Location loc, Value a, Value b) {
  auto shape = *broadcastShapes(typeOf(a).getShape(), typeOf(b).getShape());
  return builder.create<SubOp>(loc, RankedTensorType::get(shape, typeOf(a).getElementType()), a, b);
}
Value add(OpBuilder& builder, Location loc, Value a, Value b) {
  auto shape = *broadcastShapes(typeOf(a).getShape(), typeOf(b).getShape());
  return builder.create<AddOp>(loc, RankedTensorType::get(shape, typeOf(a).getElementType()), a, b);
}
Value div(OpBuilder& builder, Location loc, Value a, Value b) {
  auto shape = *broadcastShapes(typeOf(a).getShape(), typeOf(b).getShape());
  return builder.create<DivOp>(loc, RankedTensorType::get(shape, typeOf(a).getElementType()), a, b);
}
Value neg(OpBuilder& builder, Location loc, Value a) { return builder.create<NegOp>(loc, a.getType(), a); }

Value reshape(OpBuilder& builder, Location loc, Value value, ArrayRef<int64_t> shape) {
  if (typeOf(value).getShape() == shape) return value;
  return builder.create<ReshapeOp>(loc, RankedTensorType::get(shape, typeOf(value).getElementType()), value);
}

// Sum over `dims`, keeping them as size 1.
Value sumKeepDims(OpBuilder& builder, Location loc, Value value, ArrayRef<int64_t> dims) {
  SmallVector<int64_t> shape(typeOf(value).getShape());
  for (int64_t d : dims) shape[d] = 1;
  return builder.create<ReduceSumOp>(loc, RankedTensorType::get(shape, typeOf(value).getElementType()), value,
                                     builder.getDenseI64ArrayAttr(dims), builder.getBoolAttr(true));
}

// The adjoint of broadcasting: sum the cotangent over the dimensions that broadcasting stretched
// or added, then drop the added ones.
Value unbroadcast(OpBuilder& builder, Location loc, Value cotangent, RankedTensorType target) {
  ArrayRef<int64_t> from = typeOf(cotangent).getShape();
  ArrayRef<int64_t> to = target.getShape();
  if (from == to) return cotangent;
  size_t lead = from.size() - to.size();
  SmallVector<int64_t> dims;
  for (size_t d = 0; d < from.size(); ++d)
    if (d < lead || (to[d - lead] == 1 && from[d] != 1)) dims.push_back(d);
  Value summed = dims.empty() ? cotangent : sumKeepDims(builder, loc, cotangent, dims);
  return reshape(builder, loc, summed, to);
}

// Expands a reduced cotangent (with reduced dims kept as 1) to `target` by broadcasting.
Value expandTo(OpBuilder& builder, Location loc, Value cotangent, RankedTensorType target) {
  Value zeros = builder.create<FillOp>(loc, target, builder.getF64FloatAttr(0.0));
  return add(builder, loc, zeros, cotangent);
}

Value swapLastTwo(OpBuilder& builder, Location loc, Value value) {
  auto type = typeOf(value);
  SmallVector<int64_t> perm = llvm::to_vector(llvm::seq<int64_t>(0, type.getRank()));
  std::swap(perm[type.getRank() - 1], perm[type.getRank() - 2]);
  SmallVector<int64_t> shape(type.getShape());
  std::swap(shape[type.getRank() - 1], shape[type.getRank() - 2]);
  return builder.create<TransposeOp>(loc, RankedTensorType::get(shape, type.getElementType()), value,
                                     builder.getDenseI64ArrayAttr(perm));
}

Value matmul(OpBuilder& builder, Location loc, Value lhs, Value rhs, bool transposeA, bool transposeB) {
  auto lhsType = typeOf(lhs), rhsType = typeOf(rhs);
  int64_t lhsRank = lhsType.getRank(), rhsRank = rhsType.getRank();
  SmallVector<int64_t> shape(lhsType.getShape().drop_back(2));
  shape.push_back(lhsType.getDimSize(lhsRank - (transposeA ? 1 : 2)));
  shape.push_back(rhsType.getDimSize(rhsRank - (transposeB ? 2 : 1)));
  return builder.create<MatmulOp>(loc, RankedTensorType::get(shape, lhsType.getElementType()), lhs, rhs,
                                  builder.getBoolAttr(transposeA), builder.getBoolAttr(transposeB));
}

bool isFloatValue(Value value) { return isa<FloatType>(typeOf(value).getElementType()); }

}  // namespace

LogicalResult AddOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  Value g = cotangents[0];
  grads.push_back(unbroadcast(builder, getLoc(), g, getLhs().getType()));
  grads.push_back(unbroadcast(builder, getLoc(), g, getRhs().getType()));
  return success();
}

LogicalResult SubOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  Value g = cotangents[0];
  grads.push_back(unbroadcast(builder, getLoc(), g, getLhs().getType()));
  grads.push_back(unbroadcast(builder, getLoc(), neg(builder, getLoc(), g), getRhs().getType()));
  return success();
}

LogicalResult MulOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  Value g = cotangents[0];
  grads.push_back(unbroadcast(builder, getLoc(), mul(builder, getLoc(), g, getRhs()), getLhs().getType()));
  grads.push_back(unbroadcast(builder, getLoc(), mul(builder, getLoc(), g, getLhs()), getRhs().getType()));
  return success();
}

LogicalResult DivOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // d(a/b)/da = 1/b;  d(a/b)/db = -(a/b)/b.
  Location loc = getLoc();
  Value g = cotangents[0];
  Value gOverB = div(builder, loc, g, getRhs());
  grads.push_back(unbroadcast(builder, loc, gOverB, getLhs().getType()));
  grads.push_back(unbroadcast(builder, loc, neg(builder, loc, mul(builder, loc, gOverB, getResult())), getRhs().getType()));
  return success();
}

LogicalResult NegOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  grads.push_back(neg(builder, getLoc(), cotangents[0]));
  return success();
}

LogicalResult ExpOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  grads.push_back(mul(builder, getLoc(), cotangents[0], getResult()));
  return success();
}

LogicalResult LogOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  grads.push_back(div(builder, getLoc(), cotangents[0], getInput()));
  return success();
}

LogicalResult TanhOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // g (1 - y^2)
  Location loc = getLoc();
  Value y = getResult();
  Value one = scalar(builder, loc, getType().getElementType(), 1.0);
  grads.push_back(mul(builder, loc, cotangents[0], sub(builder, loc, one, mul(builder, loc, y, y))));
  return success();
}

LogicalResult SqrtOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // g / (2 y)
  Location loc = getLoc();
  Value half = scalar(builder, loc, getType().getElementType(), 0.5);
  grads.push_back(div(builder, loc, mul(builder, loc, cotangents[0], half), getResult()));
  return success();
}

LogicalResult RsqrtOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // d x^(-1/2) = -1/2 x^(-3/2) = -1/2 y^3
  Location loc = getLoc();
  Value y = getResult();
  Value minusHalf = scalar(builder, loc, getType().getElementType(), -0.5);
  Value y3 = mul(builder, loc, mul(builder, loc, y, y), y);
  grads.push_back(mul(builder, loc, cotangents[0], mul(builder, loc, y3, minusHalf)));
  return success();
}

LogicalResult GeluTanhOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // gelu(x) = x/2 (1 + t), t = tanh(c (x + a x^3));
  // gelu'(x) = (1 + t)/2 + x/2 (1 - t^2) c (1 + 3 a x^2).
  constexpr double kSqrtTwoOverPi = 0.7978845608028654;
  constexpr double kCubic = 0.044715;
  Location loc = getLoc();
  Type element = getType().getElementType();
  Value x = getInput();
  Value x2 = mul(builder, loc, x, x);
  Value inner = mul(builder, loc, add(builder, loc, x, mul(builder, loc, mul(builder, loc, x2, x), scalar(builder, loc, element, kCubic))),
                    scalar(builder, loc, element, kSqrtTwoOverPi));
  Value t = builder.create<TanhOp>(loc, inner.getType(), inner);
  Value one = scalar(builder, loc, element, 1.0);
  Value half = scalar(builder, loc, element, 0.5);
  Value left = mul(builder, loc, add(builder, loc, one, t), half);
  Value sech2 = sub(builder, loc, one, mul(builder, loc, t, t));
  Value innerSlope = mul(builder, loc, add(builder, loc, one, mul(builder, loc, x2, scalar(builder, loc, element, 3 * kCubic))),
                         scalar(builder, loc, element, kSqrtTwoOverPi));
  Value right = mul(builder, loc, mul(builder, loc, mul(builder, loc, x, half), sech2), innerSlope);
  grads.push_back(mul(builder, loc, cotangents[0], add(builder, loc, left, right)));
  return success();
}

LogicalResult CastOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  if (!isFloatValue(getInput())) {
    grads.push_back(Value());
    return success();
  }
  grads.push_back(builder.create<CastOp>(getLoc(), getInput().getType(), cotangents[0]));
  return success();
}

LogicalResult MatmulOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // C = op(A) op(B):  d op(A) = G op(B)^T,  d op(B) = op(A)^T G.
  Location loc = getLoc();
  Value g = cotangents[0];
  bool ta = getTransposeA(), tb = getTransposeB();
  Value gradOpA = matmul(builder, loc, g, getRhs(), false, !tb);
  grads.push_back(ta ? swapLastTwo(builder, loc, gradOpA) : gradOpA);

  Value lhs = getLhs();
  Value gradOpB;
  if (getRhs().getType().getRank() == 2 && getLhs().getType().getRank() > 2) {
    // B is shared by every batch: fold the batch into the rows, then one [K, M'] x [M', N] product.
    Value rowsA = ta ? swapLastTwo(builder, loc, lhs) : lhs;
    auto rowsType = typeOf(rowsA);
    int64_t k = rowsType.getShape().back();
    int64_t rows = rowsType.getNumElements() / k;
    int64_t n = typeOf(g).getShape().back();
    gradOpB = matmul(builder, loc, reshape(builder, loc, rowsA, {rows, k}), reshape(builder, loc, g, {rows, n}), true, false);
  } else {
    gradOpB = matmul(builder, loc, lhs, g, !ta, false);
  }
  grads.push_back(tb ? swapLastTwo(builder, loc, gradOpB) : gradOpB);
  return success();
}

LogicalResult RmsNormOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // One fused op (dg.rms_norm_backward documents the formulas).
  Value weight = getWeight();
  Type gradWeightType = weight ? weight.getType() : Type();
  auto backward = builder.create<RmsNormBackwardOp>(getLoc(), getInput().getType(), gradWeightType, getInput(), cotangents[0],
                                                    weight, getEpsAttr());
  grads.push_back(backward.getGradInput());
  if (weight) grads.push_back(backward.getGradWeight());
  return success();
}

LogicalResult SoftmaxOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // dx = y (g - sum(g y, axis))
  Location loc = getLoc();
  Value y = getResult();
  int64_t axis = getAxisAttr().getInt();
  if (axis < 0) axis += getType().getRank();
  Value dot = sumKeepDims(builder, loc, mul(builder, loc, cotangents[0], y), {axis});
  grads.push_back(mul(builder, loc, y, sub(builder, loc, cotangents[0], dot)));
  return success();
}

namespace {
// Cotangent of a reduction's input: the result cotangent with the reduced dims restored as 1,
// broadcast back to the input shape.
Value reductionInputCotangent(OpBuilder& builder, Operation* op, Value cotangent) {
  auto inputType = typeOf(op->getOperand(0));
  SmallVector<int64_t> keptShape(inputType.getShape());
  for (int64_t d : op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef()) keptShape[d] = 1;
  return expandTo(builder, op->getLoc(), reshape(builder, op->getLoc(), cotangent, keptShape), inputType);
}
}  // namespace

LogicalResult ReduceSumOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  grads.push_back(reductionInputCotangent(builder, *this, cotangents[0]));
  return success();
}

LogicalResult ReduceMeanOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  int64_t count = 1;
  for (int64_t d : getDims()) count *= getInput().getType().getDimSize(d);
  Value scaled = mul(builder, getLoc(), cotangents[0], scalar(builder, getLoc(), getType().getElementType(), 1.0 / count));
  grads.push_back(reductionInputCotangent(builder, *this, scaled));
  return success();
}

LogicalResult TransposeOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  SmallVector<int64_t> inverse(getPerm().size());
  for (size_t k = 0; k < inverse.size(); ++k) inverse[getPerm()[k]] = k;
  grads.push_back(builder.create<TransposeOp>(getLoc(), getInput().getType(), cotangents[0],
                                              builder.getDenseI64ArrayAttr(inverse)));
  return success();
}

LogicalResult ReshapeOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  grads.push_back(reshape(builder, getLoc(), cotangents[0], getInput().getType().getShape()));
  return success();
}

LogicalResult RopeOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // A rotation's transpose is the rotation by the opposite angle; positions get no gradient.
  grads.push_back(builder.create<RopeOp>(getLoc(), getType(), cotangents[0], getPositions(), getThetaAttr(),
                                         getRotatedPairsAttr(), getFrequencyDimAttr(), builder.getBoolAttr(!getInverse())));
  grads.push_back(Value());
  return success();
}

LogicalResult ConcatOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // Each input receives its own block of the cotangent.
  int64_t dim = getDimAttr().getInt(), start = 0;
  for (Value input : getInputs()) {
    grads.push_back(builder.create<SliceOp>(getLoc(), input.getType(), cotangents[0], builder.getI64IntegerAttr(dim),
                                            builder.getI64IntegerAttr(start)));
    start += typeOf(input).getDimSize(dim);
  }
  return success();
}

LogicalResult SliceOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // The block's cotangent goes back in place, between zeros for the rest of the dimension; an
  // integer slice (ids) has none.
  if (!cotangents[0]) {
    grads.push_back(Value());
    return success();
  }
  Location loc = getLoc();
  auto inputType = getInput().getType();
  int64_t dim = getDimAttr().getInt(), start = getStartAttr().getInt();
  int64_t after = inputType.getDimSize(dim) - start - getType().getDimSize(dim);
  auto zeros = [&](int64_t size) -> Value {
    SmallVector<int64_t> shape(inputType.getShape());
    shape[dim] = size;
    return builder.create<FillOp>(loc, RankedTensorType::get(shape, inputType.getElementType()), builder.getF64FloatAttr(0.0));
  };
  SmallVector<Value> blocks;
  if (start > 0) blocks.push_back(zeros(start));
  blocks.push_back(cotangents[0]);
  if (after > 0) blocks.push_back(zeros(after));
  grads.push_back(blocks.size() == 1 ? cotangents[0]
                                     : builder.create<ConcatOp>(loc, inputType, blocks, getDimAttr()).getResult());
  return success();
}

LogicalResult AttentionOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  auto backward = builder.create<AttentionBackwardOp>(
      getLoc(), getQuery().getType(), getKey().getType(), getValue().getType(), getQuery(), getKey(), getValue(),
      getKeyValid(), cotangents[0], getMaskAttr(), getWindowAttr(), getPrefixLenAttr(), getScaleAttr(), getSegmentIds(),
      getDocumentIds(), getTrailingKeysAttr());
  // key_valid and the segment and document ids choose keys: no gradient.
  grads.append({backward.getGradQuery(), backward.getGradKey(), backward.getGradValue(), Value()});
  if (getSegmentIds()) grads.push_back(Value());
  if (getDocumentIds()) grads.push_back(Value());
  return success();
}

LogicalResult MoeRouteOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // The expert choice is discrete: only the weights carry a gradient (to the logits and the scale).
  auto backward = builder.create<MoeRouteBackwardOp>(getLoc(), getLogits().getType(), getPerExpertScale().getType(),
                                                     getLogits(), getPerExpertScale(), getIndices(), cotangents[0],
                                                     getTopKAttr());
  grads.append({backward.getGradLogits(), backward.getGradPerExpertScale()});
  return success();
}

LogicalResult MoeExpertsOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // The pre-activations exist for the backward alone: dg-keep-expert-activations adds them after
  // differentiation, so a program that differentiates through them is malformed.
  if (getGateUpRows())
    return emitOpError() << "has gate_up_rows, which dg-keep-expert-activations adds after differentiation; "
                            "they have no derivative";
  // Every gradient is built; those of a frozen base go unused and canonicalization drops them from
  // the backward (MoeExpertsBackwardOp's DropUnusedBaseGradients), so they are never computed.
  auto typeOrNull = [](Value value) { return value ? value.getType() : Type(); };
  auto backward = builder.create<MoeExpertsBackwardOp>(
      getLoc(), getInput().getType(), getWeights().getType(), getGateUp().getType(), getDown().getType(),
      typeOrNull(getLoraGateUpA()), typeOrNull(getLoraGateUpB()), typeOrNull(getLoraDownA()),
      typeOrNull(getLoraDownB()), getInput(), getWeights(), getIndices(), getGateUp(), getDown(), cotangents[0],
      Value(), getLoraGateUpA(), getLoraGateUpB(), getLoraDownA(), getLoraDownB(), getExpertOffsetAttr(),
      getLoraScaleAttr());
  grads.append({backward.getGradInput(), backward.getGradWeights(), Value(), backward.getGradGateUp(),
                backward.getGradDown()});
  if (getLoraGateUpA()) grads.append({backward.getGradLoraGateUpA(), backward.getGradLoraGateUpB()});
  if (getLoraDownA()) grads.append({backward.getGradLoraDownA(), backward.getGradLoraDownB()});
  return success();
}

LogicalResult GatherOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // Each looked-up row receives the cotangents of every position that read it, except the padding
  // row; ids get none. The gradient table holds the same global rows as the table.
  grads.push_back(builder.create<ScatterAddOp>(getLoc(), getTable().getType(), getIds(), cotangents[0],
                                               getPaddingIdxAttr(), getRowOffsetAttr()));
  grads.push_back(Value());
  return success();
}

LogicalResult ScatterAddOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // The transpose of the scatter is the gather of the same rows: an update added at row r receives
  // row r of the cotangent. Ids outside the block were dropped and gather gives them zeros; the
  // skipped row never received anything, so its cotangent row is zeroed before the gather.
  Value cotangent = cotangents[0];
  auto table = typeOf(cotangent);
  const int64_t rows = table.getDimSize(0), width = table.getDimSize(1);
  if (auto skip = getSkipIdAttr()) {
    const int64_t local = skip.getInt() - getRowOffset().getInt();
    if (local >= 0 && local < rows) {
      auto block = [&](int64_t start, int64_t size) {
        return builder.create<SliceOp>(getLoc(), RankedTensorType::get({size, width}, table.getElementType()), cotangent,
                                       builder.getI64IntegerAttr(0), builder.getI64IntegerAttr(start));
      };
      SmallVector<Value> pieces;
      if (local > 0) pieces.push_back(block(0, local));
      pieces.push_back(builder.create<FillOp>(getLoc(), RankedTensorType::get({1, width}, table.getElementType()),
                                              builder.getF64FloatAttr(0.0)));
      if (local + 1 < rows) pieces.push_back(block(local + 1, rows - local - 1));
      cotangent = pieces.size() == 1 ? pieces.front()
                                     : builder.create<ConcatOp>(getLoc(), table, pieces, builder.getI64IntegerAttr(0)).getResult();
    }
  }
  auto updates = getUpdates().getType();
  SmallVector<int64_t> gatheredShape(updates.getShape());
  Value gathered = builder.create<GatherOp>(getLoc(), RankedTensorType::get(gatheredShape, table.getElementType()), cotangent,
                                            getIds(), IntegerAttr(), getRowOffsetAttr());
  // A 16-bit update of an f32 table gets its cotangent in its own type.
  if (updates.getElementType() != table.getElementType()) gathered = builder.create<CastOp>(getLoc(), updates, gathered);
  grads.push_back(Value());
  grads.push_back(gathered);
  return success();
}

LogicalResult CrossEntropyOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // Only the logits are differentiated: ids have no gradient, and the bonus is a constant (it
  // depends on the diffusion time only).
  grads.push_back(builder.create<CrossEntropyBackwardOp>(getLoc(), getLogits().getType(), getLogits(), getTargets(),
                                                         getBonusIds(), getBonus(), cotangents[0], getSoftcapAttr()));
  grads.append(getNumOperands() - 1, Value());
  return success();
}

// Collectives. The function differentiated is the sum over the group's ranks of each rank's loss,
// so a cotangent flows back to every rank whose input a result read. A rank's derivative rule emits
// the adjoint collective, which every rank runs alike.
namespace {
LogicalResult requireSum(Operation* op, ReductionKind reduce) {
  if (reduce == ReductionKind::Sum) return success();
  return op->emitOpError() << "has no derivative rule for reduce = " << stringifyReductionKind(reduce)
                           << " (only sum is differentiable)";
}
}  // namespace

// Every rank's result sums every rank's input: each input's cotangent is the sum of the results'.
LogicalResult AllReduceOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  if (failed(requireSum(*this, getReduce()))) return failure();
  grads.push_back(builder.create<AllReduceOp>(getLoc(), getInput().getType(), cotangents[0], getAxisAttr(),
                                              ReductionKindAttr::get(getContext(), ReductionKind::Sum)));
  return success();
}

// Rank r's input is block r of every rank's result: its cotangent sums block r of theirs.
LogicalResult AllGatherOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  grads.push_back(builder.create<ReduceScatterOp>(getLoc(), getInput().getType(), cotangents[0], getAxisAttr(),
                                                  ReductionKindAttr::get(getContext(), ReductionKind::Sum)));
  return success();
}

// Block r of every rank's input went into rank r's result alone.
LogicalResult ReduceScatterOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents,
                                        SmallVectorImpl<Value>& grads) {
  if (failed(requireSum(*this, getReduce()))) return failure();
  grads.push_back(builder.create<AllGatherOp>(getLoc(), getInput().getType(), cotangents[0], getAxisAttr(),
                                              ReductionKindAttr::get(getContext(), ReductionKind::Sum)));
  return success();
}

// Only the root's input reached the results, all of them: it gets their sum, the others zero.
LogicalResult BroadcastOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  if (!isFloatValue(getInput())) {
    grads.push_back(Value());
    return success();
  }
  grads.push_back(builder.create<ReduceToRootOp>(getLoc(), getInput().getType(), cotangents[0], getAxisAttr(),
                                                 getRootAttr()));
  return success();
}

// Every rank's input reached the root's result alone.
LogicalResult ReduceToRootOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents,
                                       SmallVectorImpl<Value>& grads) {
  grads.push_back(builder.create<BroadcastOp>(getLoc(), getInput().getType(), cotangents[0], getAxisAttr(),
                                              getRootAttr()));
  return success();
}

// Each received row goes back to where it came from: the reverse exchange, sending the result
// cotangent's rows with the received counts. It lands in the input's layout (rows grouped by
// destination peer), and the unsent rows' cotangent is its zero tail. The counts get none.
LogicalResult AllToAllOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  if (!isFloatValue(getInput())) {
    grads.append({Value(), Value()});
    return success();
  }
  auto reverse = builder.create<AllToAllOp>(getLoc(), getInput().getType(), getSendCounts().getType(), cotangents[0],
                                            getRecvCounts(), getAxisAttr());
  grads.append({reverse.getResult(), Value()});
  return success();
}

// Expert-parallel dispatch. The routing table is discrete; a permutation's derivative is its
// adjoint; the combine's is the permutation of the cotangent, scaled per route.

LogicalResult MoeDispatchOp::buildVjp(OpBuilder&, ArrayRef<Value>, SmallVectorImpl<Value>& grads) {
  grads.push_back(Value());
  return success();
}

LogicalResult MoePermuteOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // Each token row was copied to its k slots: its cotangent is the sum of theirs.
  Value input = isFloatValue(getInput())
                    ? builder.create<MoeCombineOp>(getLoc(), getInput().getType(), cotangents[0], getSlots(), Value()).getResult()
                    : Value();
  grads.append({input, Value()});
  return success();
}

LogicalResult MoeCombineOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  Location loc = getLoc();
  Value tokenRows = builder.create<MoePermuteOp>(loc, getRows().getType(), cotangents[0], getSlots());
  Value weights = getWeights();
  if (!weights) {
    grads.append({tokenRows, Value()});
    return success();
  }
  // Per route r = slot of (m, j): d rows[r] = w[m, j] · dy[m] and d w[m, j] = dy[m] · rows[r], in the
  // weights' type (f32 for 16-bit rows, as the forward sums).
  auto rows = getRows().getType();
  const int64_t routes = rows.getDimSize(0);
  Type wide = typeOf(weights).getElementType();
  auto castTo = [&](Value value, Type element) -> Value {
    if (typeOf(value).getElementType() == element) return value;
    return builder.create<CastOp>(loc, RankedTensorType::get(typeOf(value).getShape(), element), value);
  };
  Value routeSlots = reshape(builder, loc, getSlots(), {routes, 1});
  Value routeWeights = builder.create<MoePermuteOp>(loc, RankedTensorType::get({routes}, wide),
                                                    reshape(builder, loc, weights, {routes}), routeSlots);
  SmallVector<int64_t> perRow(rows.getRank(), 1);
  perRow[0] = routes;
  Value cotangentRows = castTo(tokenRows, wide);
  Value gradRows = castTo(mul(builder, loc, cotangentRows, reshape(builder, loc, routeWeights, perRow)), rows.getElementType());
  Value products = mul(builder, loc, cotangentRows, castTo(getRows(), wide));
  if (rows.getRank() > 1) {
    SmallVector<int64_t> trailing;
    for (int64_t d = 1; d < rows.getRank(); ++d) trailing.push_back(d);
    products = builder.create<ReduceSumOp>(loc, RankedTensorType::get({routes}, wide), products,
                                           builder.getDenseI64ArrayAttr(trailing), builder.getBoolAttr(false));
  }
  // Back from slot order to (m, j) order.
  Value routeGrads = builder.create<MoeCombineOp>(loc, products.getType(), products, routeSlots, Value());
  grads.append({gradRows, Value(), reshape(builder, loc, routeGrads, typeOf(weights).getShape())});
  return success();
}

LogicalResult MoeLocalExpertsOp::buildVjp(OpBuilder& builder, ArrayRef<Value> cotangents, SmallVectorImpl<Value>& grads) {
  // The outputs are unweighted: the backward with every row's weight 1.
  auto rows = getRows().getType();
  Value ones = builder.create<FillOp>(getLoc(), RankedTensorType::get({rows.getDimSize(0)}, rows.getElementType()),
                                      builder.getF64FloatAttr(1.0));
  // A frozen base's gradients go unused and canonicalization drops them, as for dg.moe_experts.
  auto backward = builder.create<MoeLocalExpertsBackwardOp>(getLoc(), rows, ones.getType(), getGateUp().getType(),
                                                            getDown().getType(), getRows(), ones, cotangents[0],
                                                            getExpertCounts(), getGateUp(), getDown());
  grads.append({backward.getGradRows(), Value(), backward.getGradGateUp(), backward.getGradDown()});
  return success();
}
