// Verifiers, folders and type inference of the dg ops.
#include "dialects/dg/IR/DgOps.h"

#include "dialects/dg/IR/DgMesh.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/Matchers.h"
#include "plan/FusedElementwiseProgram.h"

using namespace mlir;
using namespace mlir::dg;

namespace {

RankedTensorType tensorType(Value value) { return cast<RankedTensorType>(value.getType()); }

bool isStatic(Type type) { return cast<RankedTensorType>(type).hasStaticShape(); }

}  // namespace

FailureOr<SmallVector<int64_t>> mlir::dg::broadcastShapes(ArrayRef<int64_t> lhs, ArrayRef<int64_t> rhs) {
  size_t rank = std::max(lhs.size(), rhs.size());
  SmallVector<int64_t> shape(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t a = i < rank - lhs.size() ? 1 : lhs[i - (rank - lhs.size())];
    int64_t b = i < rank - rhs.size() ? 1 : rhs[i - (rank - rhs.size())];
    if (a != b && a != 1 && b != 1) return failure();
    shape[i] = a == 1 ? b : a;
  }
  return shape;
}

FailureOr<SmallVector<int64_t>> mlir::dg::broadcastShapeOf(TypeRange types) {
  SmallVector<int64_t> shape;
  for (Type type : types) {
    auto broadcast = broadcastShapes(shape, cast<RankedTensorType>(type).getShape());
    if (failed(broadcast)) return failure();
    shape = std::move(*broadcast);
  }
  return shape;
}

SmallVector<int64_t> mlir::dg::reducedShape(ArrayRef<int64_t> shape, ArrayRef<int64_t> dims, bool keepDims) {
  SmallVector<int64_t> reduced;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    if (!llvm::is_contained(dims, d)) reduced.push_back(shape[d]);
    else if (keepDims) reduced.push_back(1);
  }
  return reduced;
}

LogicalResult mlir::dg::verifyBroadcastShape(Operation* op) {
  auto result = tensorType(op->getResult(0));
  FailureOr<SmallVector<int64_t>> broadcast = broadcastShapeOf(op->getOperandTypes());
  if (failed(broadcast)) {
    InFlightDiagnostic diagnostic = op->emitOpError() << "shapes ";
    for (auto [index, other] : llvm::enumerate(op->getOperands()))
      diagnostic << (index == 0 ? "" : index + 1 == op->getNumOperands() ? " and " : ", ") << other.getType();
    return diagnostic << " do not broadcast";
  }
  const SmallVector<int64_t>& shape = *broadcast;
  if (ArrayRef<int64_t>(shape) != result.getShape())
    return op->emitOpError() << "result shape must be the broadcast shape "
                             << RankedTensorType::get(shape, result.getElementType()) << ", got " << result;
  return success();
}

LogicalResult mlir::dg::verifyBroadcastBinaryOp(Operation* op) {
  auto lhs = tensorType(op->getOperand(0));
  auto rhs = tensorType(op->getOperand(1));
  auto result = tensorType(op->getResult(0));
  if (lhs.getElementType() != rhs.getElementType() || lhs.getElementType() != result.getElementType())
    return op->emitOpError() << "operands and result must share the element type, got " << lhs.getElementType()
                             << ", " << rhs.getElementType() << " -> " << result.getElementType();
  return verifyBroadcastShape(op);
}

bool mlir::dg::isWideningResult(Type operandElement, Type resultElement) {
  return operandElement == resultElement ||
         (isa<FloatType>(operandElement) && operandElement.getIntOrFloatBitWidth() == 16 && resultElement.isF32());
}

Type mlir::dg::gateUpRowsElementType(Type input) {
  if (isa<FloatType>(input) && input.getIntOrFloatBitWidth() == 16) return Float32Type::get(input.getContext());
  return input;
}

LogicalResult mlir::dg::verifyReduceOp(Operation* op) {
  auto input = tensorType(op->getOperand(0));
  auto result = tensorType(op->getResult(0));
  auto dims = op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef();
  bool keepDims = op->getAttrOfType<BoolAttr>("keep_dims") && op->getAttrOfType<BoolAttr>("keep_dims").getValue();
  if (dims.empty()) return op->emitOpError() << "needs at least one dim to reduce";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= input.getRank())
      return op->emitOpError() << "dim " << dims[i] << " is outside the input's rank " << input.getRank();
    if (i > 0 && dims[i] <= dims[i - 1]) return op->emitOpError() << "dims must be sorted and unique";
  }
  SmallVector<int64_t> expected = reducedShape(input.getShape(), dims, keepDims);
  if (ArrayRef<int64_t>(expected) != result.getShape() || !isWideningResult(input.getElementType(), result.getElementType()))
    return op->emitOpError() << "result must be " << RankedTensorType::get(expected, input.getElementType())
                             << " (or f32 for a 16-bit input), got " << result;
  return success();
}

std::optional<int64_t> mlir::dg::collectiveGroupSize(Operation* op) {
  auto axis = op->getAttrOfType<StringAttr>("axis");
  if (!axis) return std::nullopt;
  return Mesh::of(op->getParentOfType<ModuleOp>()).axisSize(axis.getValue());
}

bool mlir::dg::isInPlaceCollective(Operation* op) { return isa<AllReduceOp, BroadcastOp, ReduceToRootOp>(op); }

namespace {
// The size of the op's mesh axis, or an error naming the undeclared axis.
FailureOr<int64_t> verifiedGroupSize(Operation* op) {
  std::optional<int64_t> size = collectiveGroupSize(op);
  if (!size)
    return op->emitOpError() << "mesh axis '" << op->getAttrOfType<StringAttr>("axis").getValue()
                             << "' is not declared in the module's dg.mesh";
  return *size;
}

LogicalResult verifyRoot(Operation* op, int64_t root, int64_t groupSize) {
  if (root < 0 || root >= groupSize)
    return op->emitOpError() << "root " << root << " must be a rank of the axis, in [0, " << groupSize << ")";
  return success();
}
}  // namespace

LogicalResult mlir::dg::verifyCollectiveOp(Operation* op) {
  FailureOr<int64_t> groupSize = verifiedGroupSize(op);
  if (failed(groupSize)) return failure();
  auto input = tensorType(op->getOperand(0));
  auto result = tensorType(op->getResult(0));
  if (input.getElementType() != result.getElementType() || input.getRank() != result.getRank() || input.getRank() == 0)
    return op->emitOpError() << "input and result must have the same element type and rank >= 1";
  SmallVector<int64_t> expected(input.getShape());
  if (auto gather = dyn_cast<AllGatherOp>(op)) {
    if (gather.getReduce() != ReductionKind::Sum)
      return op->emitOpError() << "reduces nothing: reduce must be omitted (sum)";
    expected[0] *= *groupSize;
  } else if (isa<ReduceScatterOp>(op)) {
    if (expected[0] % *groupSize != 0)
      return op->emitOpError() << "dim 0 (" << expected[0] << ") is not divisible by the axis size " << *groupSize;
    expected[0] /= *groupSize;
  }
  if (ArrayRef<int64_t>(expected) != result.getShape())
    return op->emitOpError() << "result must be " << RankedTensorType::get(expected, input.getElementType());
  return success();
}

LogicalResult BroadcastOp::verify() {
  FailureOr<int64_t> groupSize = verifiedGroupSize(*this);
  if (failed(groupSize)) return failure();
  return verifyRoot(*this, getRoot(), *groupSize);
}

LogicalResult ReduceToRootOp::verify() {
  FailureOr<int64_t> groupSize = verifiedGroupSize(*this);
  if (failed(groupSize)) return failure();
  return verifyRoot(*this, getRoot(), *groupSize);
}

LogicalResult AllToAllOp::verify() {
  FailureOr<int64_t> groupSize = verifiedGroupSize(*this);
  if (failed(groupSize)) return failure();
  auto input = getInput().getType();
  auto result = getResult().getType();
  if (input.getRank() == 0) return emitOpError() << "input must have rank >= 1 (rows grouped by destination peer)";
  if (result.getElementType() != input.getElementType() || result.getRank() != input.getRank() ||
      result.getShape().drop_front() != input.getShape().drop_front()) {
    SmallVector<int64_t> expected(input.getShape());
    expected[0] = result.getRank() > 0 ? result.getDimSize(0) : 1;
    return emitOpError() << "result must be " << RankedTensorType::get(expected, input.getElementType())
                         << " (the input's rows and element type, any capacity), got " << result;
  }
  auto counts = RankedTensorType::get({*groupSize}, IntegerType::get(getContext(), 64));
  if (getSendCounts().getType() != counts)
    return emitOpError() << "send_counts must be " << counts << " (one count per rank of the axis), got "
                         << getSendCounts().getType();
  if (getRecvCounts().getType() != counts)
    return emitOpError() << "recv_counts must be " << counts << " (one count per rank of the axis), got "
                         << getRecvCounts().getType();
  return success();
}

//===----------------------------------------------------------------------===//
// Graph boundary
//===----------------------------------------------------------------------===//

LogicalResult ParamOp::verify() {
  if (getName().empty()) return emitOpError() << "needs a non-empty name";
  if (!isStatic(getType())) return emitOpError() << "parameters must have a static shape";
  if (auto init = getInitAttr()) {
    auto kind = dyn_cast_or_null<StringAttr>(init.get("kind"));
    // A frozen base weight's codes or scales (dg-base-dtype): filled by quantizing the weight's tensor
    // (docs/plan-format.md, "Header"); `base` is the weight's own init, checked like this one.
    if (kind && kind.getValue() == "quantized") {
      auto format = dyn_cast_or_null<StringAttr>(init.get("format"));
      auto part = dyn_cast_or_null<StringAttr>(init.get("part"));
      if (!format || !llvm::is_contained({"int8", "nf4"}, format.getValue()) || !part ||
          !llvm::is_contained({"codes", "scale", "absmax"}, part.getValue()) ||
          !isa_and_nonnull<StringAttr>(init.get("weight")) || !isa_and_nonnull<DenseI64ArrayAttr>(init.get("shape")))
        return emitOpError() << "init kind \"quantized\" needs 'format' (\"int8\" or \"nf4\"), 'part' (\"codes\", "
                                "\"scale\" or \"absmax\"), 'weight' (a name) and 'shape' (array<i64>)";
      auto base = dyn_cast_or_null<DictionaryAttr>(init.get("base"));
      if (!base) return success();
      kind = dyn_cast_or_null<StringAttr>(base.get("kind"));
      init = base;
    }
    if (!kind || !llvm::is_contained({"normal", "uniform", "ones", "zeros"}, kind.getValue()))
      return emitOpError() << "init.kind must be \"normal\", \"uniform\", \"ones\" or \"zeros\"";
    if (kind.getValue() == "normal" && !isa_and_nonnull<FloatAttr>(init.get("std")))
      return emitOpError() << "init kind \"normal\" needs a float 'std'";
    if (kind.getValue() == "uniform" && !isa_and_nonnull<FloatAttr>(init.get("bound")))
      return emitOpError() << "init kind \"uniform\" needs a float 'bound'";
  }
  return success();
}

LogicalResult InputOp::verify() {
  if (getName().empty()) return emitOpError() << "needs a non-empty name";
  if (!isStatic(getType())) return emitOpError() << "inputs must have a static shape (plans are shape-specialised)";
  return success();
}

LogicalResult ConstantOp::inferReturnTypes(MLIRContext*, std::optional<Location>, ValueRange,
                                           DictionaryAttr attributes, OpaqueProperties properties, RegionRange,
                                           SmallVectorImpl<Type>& inferred) {
  auto value = properties.as<Properties*>()->value;
  if (!value) return failure();
  inferred.push_back(cast<TypedAttr>(value).getType());
  return success();
}

OpFoldResult ConstantOp::fold(FoldAdaptor) { return getValue(); }

//===----------------------------------------------------------------------===//
// Elementwise, contraction, normalisation
//===----------------------------------------------------------------------===//

LogicalResult AssignOp::verify() {
  auto param = getTarget().getDefiningOp<ParamOp>();
  if (!param) return emitOpError() << "target must be a dg.param";
  // A later read of the same parameter would see the old or the new bytes depending on scheduling.
  for (Operation* after = getOperation()->getNextNode(); after; after = after->getNextNode())
    if (auto other = dyn_cast<ParamOp>(after); other && other.getName() == param.getName())
      if (!other.getResult().use_empty())
        return emitOpError() << "parameter '" << param.getName() << "' is read after it is assigned";
  for (Operation* user : param.getResult().getUsers())
    if (user != getOperation() && user->getBlock() == getOperation()->getBlock() && getOperation()->isBeforeInBlock(user))
      return emitOpError() << "parameter '" << param.getName() << "' is read after it is assigned";
  return success();
}

namespace {
// The parameter `value` reads, through reshapes and stop_gradients (views of its bytes), or null.
ParamOp parameterRead(Value value) {
  for (;;) {
    if (auto reshape = value.getDefiningOp<ReshapeOp>()) value = reshape.getInput();
    else if (auto barrier = value.getDefiningOp<StopGradientOp>()) value = barrier.getInput();
    else return value.getDefiningOp<ParamOp>();
  }
}

// Whether `op` reads the parameter named `name` (through any dg.param of that name).
bool readsParameter(Operation* op, StringRef name) {
  return llvm::any_of(op->getOperands(), [&](Value operand) {
    ParamOp param = parameterRead(operand);
    return param && param.getName() == name;
  });
}

// A select that keeps `target`'s elements on one side may write target's bytes when it has
// target's type, its other operands read no other view of the parameter, and nothing between the
// select and `assign` reads the parameter: each element is read before it is written, at its own index.
bool selectWorksInPlace(SelectOp select, AssignOp assign, Value target) {
  if (target != select.getOnTrue() && target != select.getOnFalse()) return false;
  if (target.getType() != select.getResult().getType() || select->getBlock() != assign->getBlock()) return false;
  const StringRef name = cast<ParamOp>(target.getDefiningOp()).getName();
  for (Value operand : select->getOperands()) {
    ParamOp param = parameterRead(operand);
    if (operand != target && param && param.getName() == name) return false;
  }
  for (Operation* op = select->getNextNode(); op && op != assign.getOperation(); op = op->getNextNode())
    if (readsParameter(op, name)) return false;
  return true;
}
}  // namespace

Value mlir::dg::inPlaceAssignTarget(Value result) {
  if (!result.hasOneUse()) return {};
  auto assign = dyn_cast<AssignOp>(*result.getUsers().begin());
  if (!assign || assign.getValue() != result) return {};
  Value target = assign.getTarget();
  if (auto update = result.getDefiningOp<AdamwOp>()) {
    const Value updated[] = {update.getParam(), update.getExpAvg(), update.getExpAvgSq()};
    return updated[cast<OpResult>(result).getResultNumber()] == target ? target : Value();
  }
  if (auto select = result.getDefiningOp<SelectOp>(); select && target.getDefiningOp<ParamOp>())
    return selectWorksInPlace(select, assign, target) ? target : Value();
  return {};
}

int64_t mlir::dg::storageBytes(RankedTensorType type) {
  return type.getNumElements() * std::max<int64_t>(type.getElementTypeBitWidth() / 8, 1);
}

bool mlir::dg::isCommunicationBuffer(Value root) {
  Operation* producer = root.getDefiningOp();
  return producer && isa<CommunicationOpInterface>(producer);
}

bool mlir::dg::isPersistentStorage(Value root) { return root.getDefiningOp<ParamOp>() || root.getDefiningOp<ConstantOp>(); }

namespace {
// Whether `value` is the only reader of its bytes: it has one use, and so has every value it is a
// view of. An in-place collective on a reshape of a value that is read elsewhere would overwrite it.
bool soleReaderOfStorage(Value value) {
  for (;;) {
    if (!value.hasOneUse()) return false;
    if (auto reshape = value.getDefiningOp<ReshapeOp>()) value = reshape.getInput();
    else if (auto barrier = value.getDefiningOp<StopGradientOp>()) value = barrier.getInput();
    else return true;
  }
}

// The last op that reads `value`'s bytes (null when none does): its users, through views and
// through the in-place collectives that reduce into them; failure when one is in another block.
FailureOr<Operation*> lastReaderOfBytes(Value value) {
  Operation* last = nullptr;
  for (Operation* user : value.getUsers()) {
    if (user->getBlock() != value.getParentBlock()) return failure();
    Operation* reader = user;
    if (isa<ReshapeOp, StopGradientOp>(user) || (isInPlaceCollective(user) && user->getOperand(0) == value)) {
      FailureOr<Operation*> later = lastReaderOfBytes(user->getResult(0));
      if (failed(later)) return failure();
      if (*later && user->isBeforeInBlock(*later)) reader = *later;
    }
    if (!last || last->isBeforeInBlock(reader)) last = reader;
  }
  return last;
}
}  // namespace

bool mlir::dg::collectiveOverwritesParameter(Operation* op) {
  // From op's input back to the parameter: views, or collectives that themselves overwrite it,
  // each read by the next link alone.
  Operation* reader = op;
  Value value = op->getOperand(0);
  while (!value.getDefiningOp<ParamOp>()) {
    Operation* producer = value.getDefiningOp();
    if (!producer || !value.hasOneUse()) return false;
    if (!isa<ReshapeOp, StopGradientOp>(producer) &&
        !(isInPlaceCollective(producer) && collectiveOverwritesParameter(producer)))
      return false;
    reader = producer;
    value = producer->getOperand(0);
  }
  auto param = value.getDefiningOp<ParamOp>();
  Block* block = op->getBlock();
  FailureOr<Operation*> lastRead = lastReaderOfBytes(op->getResult(0));
  if (failed(lastRead) || param->getBlock() != block) return false;
  Operation* reducedUntil = *lastRead ? *lastRead : op;
  // Every other use of a dg.param of that name is a dg.assign's target after the last read of the
  // reduced bytes, and there is one: the entry leaves the parameter a value of its own.
  bool overwritten = false;
  for (ParamOp same : block->getOps<ParamOp>()) {
    if (same.getName() != param.getName()) continue;
    for (OpOperand& use : same.getResult().getUses()) {
      if (same == param && use.getOwner() == reader) continue;
      auto assign = dyn_cast<AssignOp>(use.getOwner());
      if (!assign || use.get() != assign.getTarget() || assign.getValue() == use.get() || assign->getBlock() != block ||
          !reducedUntil->isBeforeInBlock(assign))
        return false;
      overwritten = true;
    }
  }
  return overwritten;
}

bool mlir::dg::collectiveWorksInPlace(Operation* op) {
  Value input = op->getOperand(0);
  return (soleReaderOfStorage(input) && !isPersistentStorage(storageRoot(input))) || collectiveOverwritesParameter(op);
}

Value mlir::dg::storageRoot(Value value) {
  for (;;) {
    if (Value target = inPlaceAssignTarget(value)) {
      value = target;
    } else if (auto reshape = value.getDefiningOp<ReshapeOp>()) {
      value = reshape.getInput();
    } else if (auto barrier = value.getDefiningOp<StopGradientOp>()) {
      value = barrier.getInput();
    } else if (Operation* collective = value.getDefiningOp(); collective && isInPlaceCollective(collective)) {
      if (!collectiveWorksInPlace(collective)) return value;
      value = collective->getOperand(0);
    } else {
      return value;
    }
  }
}

LogicalResult RmsNormBackwardOp::verify() {
  auto input = getInput().getType();
  if (input.getRank() < 1) return emitOpError() << "input needs rank >= 1";
  const bool weighted = static_cast<bool>(getWeight());
  if (weighted != static_cast<bool>(getGradWeight()))
    return emitOpError() << "grad_weight is produced exactly when there is a weight";
  if (!weighted) return success();
  auto expected = RankedTensorType::get({input.getShape().back()}, input.getElementType());
  if (getWeight().getType() != expected || getGradWeight().getType() != expected)
    return emitOpError() << "weight and grad_weight must be " << expected;
  return success();
}

LogicalResult AdamwOp::verify() {
  auto tensor = getParam().getType(), scalar = getLr().getType();
  if (scalar.getRank() != 0 || scalar.getElementType() != tensor.getElementType())
    return emitOpError() << "grad_scale, lr and the bias corrections must be " << RankedTensorType::get({}, tensor.getElementType());
  for (auto [name, beta] : {std::pair{"beta1", getBeta1().convertToDouble()}, std::pair{"beta2", getBeta2().convertToDouble()}})
    if (!(beta >= 0 && beta < 1)) return emitOpError() << name << " must be in [0, 1), got " << beta;
  if (!(getEpsilon().convertToDouble() > 0)) return emitOpError() << "epsilon must be positive";
  if (!(getWeightDecay().convertToDouble() >= 0)) return emitOpError() << "weight_decay must be >= 0";
  return success();
}

LogicalResult CastOp::verify() {
  Type from = getInput().getType().getElementType();
  Type to = getResult().getType().getElementType();
  if (isa<FloatType>(from) && !isa<FloatType>(to))
    return emitOpError() << "cannot cast float " << from << " to integer " << to;
  return success();
}

OpFoldResult CastOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType()) return getInput();
  return {};
}

LogicalResult DequantizeOp::verify() {
  // NF4's block: the absmax of 64 consecutive elements of a row (docs/training.md, "Frozen low-precision base").
  constexpr int64_t kNf4BlockSize = 64;
  ArrayRef<int64_t> shape = getResult().getType().getShape();
  if (shape.empty()) return emitOpError() << "result must have rank >= 1 (a weight), got " << getResult().getType();
  SmallVector<int64_t> codesShape(shape), scalesShape(shape);
  Type codesElement;
  if (getFormat() == "int8") {
    codesElement = IntegerType::get(getContext(), 8);
    scalesShape.pop_back();
  } else if (getFormat() == "nf4") {
    if (shape.back() % kNf4BlockSize != 0)
      return emitOpError() << "nf4: the last dimension " << shape.back() << " must be a multiple of " << kNf4BlockSize;
    codesElement = IntegerType::get(getContext(), 8, IntegerType::Unsigned);
    codesShape.back() /= 2;
    scalesShape.back() /= kNf4BlockSize;
  } else {
    return emitOpError() << "format must be \"int8\" or \"nf4\", got \"" << getFormat() << "\"";
  }
  auto expectedCodes = RankedTensorType::get(codesShape, codesElement);
  if (getCodes().getType() != expectedCodes)
    return emitOpError() << getFormat() << " codes must be " << expectedCodes << ", got " << getCodes().getType();
  auto expectedScales = RankedTensorType::get(scalesShape, Float32Type::get(getContext()));
  if (getScales().getType() != expectedScales)
    return emitOpError() << getFormat() << " scales must be " << expectedScales << ", got " << getScales().getType();
  return success();
}

LogicalResult CompareOp::verify() {
  if (getLhs().getType().getElementType() != getRhs().getType().getElementType())
    return emitOpError() << "operands must share the element type, got " << getLhs().getType().getElementType() << " and "
                         << getRhs().getType().getElementType();
  return verifyBroadcastShape(*this);
}

LogicalResult SelectOp::verify() {
  Type element = getResult().getType().getElementType();
  if (getOnTrue().getType().getElementType() != element || getOnFalse().getType().getElementType() != element)
    return emitOpError() << "on_true, on_false and result must share the element type, got "
                         << getOnTrue().getType().getElementType() << ", " << getOnFalse().getType().getElementType()
                         << " -> " << element;
  return verifyBroadcastShape(*this);
}

StringRef mlir::dg::fusedElementwiseDTypeName(Type element) {
  if (element.isF32()) return "f32";
  if (element.isF64()) return "f64";
  if (element.isBF16()) return "bf16";
  if (element.isF16()) return "f16";
  if (element.isInteger(1)) return "bool";
  return {};
}

LogicalResult FusedElementwiseOp::verify() {
  std::string error;
  const std::optional<dgemma::fused::Program> program =
      dgemma::fused::parseProgram(getProgram(), getInputs().size(), error);
  if (!program) return emitOpError() << "program: " << error;
  ArrayRef<int64_t> shape = getResult().getType().getShape();
  std::vector<std::string> inputDTypes;
  for (auto [index, input] : llvm::enumerate(getInputs())) {
    auto type = cast<RankedTensorType>(input.getType());
    FailureOr<SmallVector<int64_t>> broadcast = broadcastShapes(type.getShape(), shape);
    if (failed(broadcast) || ArrayRef<int64_t>(*broadcast) != shape)
      return emitOpError() << "input " << index << " of type " << type << " does not broadcast to the result shape";
    StringRef dtype = fusedElementwiseDTypeName(type.getElementType());
    if (dtype.empty()) return emitOpError() << "input " << index << ": expected a float or i1 tensor, got " << type;
    inputDTypes.push_back(dtype.str());
  }
  const auto dtypes = dgemma::fused::valueDTypes(*program, inputDTypes, error);
  if (!dtypes) return emitOpError() << "program: " << error;
  if (StringRef(dtypes->back()) != fusedElementwiseDTypeName(getResult().getType().getElementType()))
    return emitOpError() << "program: the last value's dtype " << dtypes->back() << " is not the result's "
                         << getResult().getType().getElementType();
  return success();
}

LogicalResult MatmulOp::verify() {
  auto lhs = getLhs().getType();
  auto rhs = getRhs().getType();
  auto result = getResult().getType();
  if (lhs.getElementType() != rhs.getElementType() || !isWideningResult(lhs.getElementType(), result.getElementType()))
    return emitOpError() << "operands and result must share the element type (or an f32 result for 16-bit operands)";
  if (lhs.getRank() < 2 || rhs.getRank() < 2) return emitOpError() << "operands need rank >= 2";
  int64_t lhsRank = lhs.getRank(), rhsRank = rhs.getRank();
  int64_t m = lhs.getDimSize(lhsRank - (getTransposeA() ? 1 : 2));
  int64_t k = lhs.getDimSize(lhsRank - (getTransposeA() ? 2 : 1));
  int64_t rhsK = rhs.getDimSize(rhsRank - (getTransposeB() ? 1 : 2));
  int64_t n = rhs.getDimSize(rhsRank - (getTransposeB() ? 2 : 1));
  if (k != rhsK) return emitOpError() << "contracting dimensions differ: " << k << " vs " << rhsK;
  ArrayRef<int64_t> batch = lhs.getShape().drop_back(2);
  if (rhsRank != 2 && rhs.getShape().drop_back(2) != batch)
    return emitOpError() << "rhs must be 2-D or have the lhs batch dimensions";
  SmallVector<int64_t> expected(batch);
  expected.append({m, n});
  if (ArrayRef<int64_t>(expected) != result.getShape())
    return emitOpError() << "result must be " << RankedTensorType::get(expected, lhs.getElementType());
  return success();
}

LogicalResult RmsNormOp::verify() {
  auto input = getInput().getType();
  if (input.getRank() < 1) return emitOpError() << "input needs rank >= 1";
  if (getResult().getType() != input) return emitOpError() << "result type must equal the input type";
  if (getEps().convertToDouble() < 0) return emitOpError() << "eps must be >= 0";
  if (Value weight = getWeight()) {
    auto weightType = cast<RankedTensorType>(weight.getType());
    if (weightType.getRank() != 1 || weightType.getDimSize(0) != input.getShape().back() ||
        weightType.getElementType() != input.getElementType())
      return emitOpError() << "weight must be " << RankedTensorType::get({input.getShape().back()}, input.getElementType());
  }
  return success();
}

LogicalResult SoftmaxOp::verify() {
  int64_t rank = getInput().getType().getRank();
  int64_t axis = getAxisAttr().getInt();
  if (axis < -rank || axis >= rank) return emitOpError() << "axis " << axis << " is outside rank " << rank;
  return success();
}

//===----------------------------------------------------------------------===//
// Layout, indexing, randomness
//===----------------------------------------------------------------------===//

LogicalResult TransposeOp::verify() {
  auto input = getInput().getType();
  ArrayRef<int64_t> perm = getPerm();
  if (static_cast<int64_t>(perm.size()) != input.getRank())
    return emitOpError() << "perm has " << perm.size() << " entries for rank " << input.getRank();
  SmallVector<bool> seen(perm.size(), false);
  SmallVector<int64_t> expected;
  for (int64_t p : perm) {
    if (p < 0 || p >= input.getRank() || seen[p]) return emitOpError() << "perm must be a permutation of 0.." << input.getRank() - 1;
    seen[p] = true;
    expected.push_back(input.getDimSize(p));
  }
  if (ArrayRef<int64_t>(expected) != getResult().getType().getShape() ||
      input.getElementType() != getResult().getType().getElementType())
    return emitOpError() << "result must be " << RankedTensorType::get(expected, input.getElementType());
  return success();
}

// transpose(matmul(a, b)) over the last two dims is matmul(b, a) with both operands' transposes
// flipped: (op(A) op(B))ᵀ = op(B)ᵀ op(A)ᵀ. Autodiff writes a weight's gradient that way (dWᵀ, then a
// transpose); the GEMM can write dW directly. Both operands must be 2-D, or batched alike, because
// the new lhs carries the batch.
LogicalResult TransposeOp::canonicalize(TransposeOp op, PatternRewriter& rewriter) {
  auto product = op.getInput().getDefiningOp<MatmulOp>();
  if (!product || !product.getResult().hasOneUse()) return failure();
  auto lhs = product.getLhs().getType(), rhs = product.getRhs().getType();
  const int64_t rank = lhs.getRank();
  if (rhs.getRank() != rank || lhs.getShape().drop_back(2) != rhs.getShape().drop_back(2)) return failure();
  SmallVector<int64_t> swapLastTwo = llvm::to_vector(llvm::seq<int64_t>(0, rank));
  std::swap(swapLastTwo[rank - 2], swapLastTwo[rank - 1]);
  if (op.getPerm() != ArrayRef<int64_t>(swapLastTwo)) return failure();
  rewriter.replaceOpWithNewOp<MatmulOp>(op, op.getResult().getType(), product.getRhs(), product.getLhs(),
                                        rewriter.getBoolAttr(!product.getTransposeB()),
                                        rewriter.getBoolAttr(!product.getTransposeA()));
  rewriter.eraseOp(product);
  return success();
}

OpFoldResult TransposeOp::fold(FoldAdaptor) {
  // Identity permutation.
  if (llvm::equal(getPerm(), llvm::seq<int64_t>(0, getPerm().size()))) return getInput();
  // transpose(transpose(x, p), q) == x when the composition is the identity.
  if (auto inner = getInput().getDefiningOp<TransposeOp>()) {
    ArrayRef<int64_t> p = inner.getPerm(), q = getPerm();
    bool identity = true;
    for (size_t k = 0; k < q.size(); ++k) identity &= p[q[k]] == static_cast<int64_t>(k);
    if (identity) return inner.getInput();
  }
  return {};
}

LogicalResult ReshapeOp::verify() {
  auto input = getInput().getType();
  auto result = getResult().getType();
  if (!input.hasStaticShape() || !result.hasStaticShape()) return emitOpError() << "shapes must be static";
  if (input.getNumElements() != result.getNumElements() || input.getElementType() != result.getElementType())
    return emitOpError() << "cannot reshape " << input << " to " << result << " (element count or type differs)";
  return success();
}

OpFoldResult ReshapeOp::fold(FoldAdaptor) {
  if (getInput().getType() == getResult().getType()) return getInput();
  // reshape(reshape(x)) == reshape(x): fold to the inner input when the type returns to it.
  if (auto inner = getInput().getDefiningOp<ReshapeOp>()) {
    if (inner.getInput().getType() == getResult().getType()) return inner.getInput();
    getInputMutable().assign(inner.getInput());
    return getResult();
  }
  return {};
}

LogicalResult ConcatOp::verify() {
  if (getInputs().empty()) return emitOpError() << "needs at least one input";
  auto result = getResult().getType();
  int64_t dim = getDimAttr().getInt();
  if (dim < 0 || dim >= result.getRank()) return emitOpError() << "dim " << dim << " is outside rank " << result.getRank();
  SmallVector<int64_t> expected(result.getShape());
  expected[dim] = 0;
  for (Value input : getInputs()) {
    auto type = cast<RankedTensorType>(input.getType());
    if (type.getRank() != result.getRank() || type.getElementType() != result.getElementType())
      return emitOpError() << "inputs must have the result's rank and element type, got " << type;
    for (int64_t d = 0; d < result.getRank(); ++d)
      if (d != dim && type.getDimSize(d) != result.getDimSize(d))
        return emitOpError() << "input " << type << " differs from the result " << result << " outside dim " << dim;
    expected[dim] += type.getDimSize(dim);
  }
  if (ArrayRef<int64_t>(expected) != result.getShape())
    return emitOpError() << "result must be " << RankedTensorType::get(expected, result.getElementType());
  return success();
}

LogicalResult SliceOp::verify() {
  auto input = getInput().getType(), result = getResult().getType();
  int64_t dim = getDimAttr().getInt(), start = getStartAttr().getInt();
  if (dim < 0 || dim >= input.getRank() || result.getRank() != input.getRank())
    return emitOpError() << "dim " << dim << " must be a dimension of the input and the result";
  if (input.getElementType() != result.getElementType()) return emitOpError() << "result must keep the element type";
  for (int64_t d = 0; d < input.getRank(); ++d)
    if (d != dim && input.getDimSize(d) != result.getDimSize(d))
      return emitOpError() << "result " << result << " differs from the input " << input << " outside dim " << dim;
  if (start < 0 || start + result.getDimSize(dim) > input.getDimSize(dim))
    return emitOpError() << "block [" << start << ", " << start + result.getDimSize(dim) << ") leaves dim " << dim << " of size "
                         << input.getDimSize(dim);
  return success();
}

LogicalResult GatherOp::verify() {
  auto table = getTable().getType();
  auto ids = getIds().getType();
  if (table.getRank() != 2) return emitOpError() << "table must be 2-D [rows, width]";
  // padding_idx is a global row, which may lie in another rank's block of the table.
  if (auto padding = getPaddingIdxAttr(); padding && padding.getInt() < 0)
    return emitOpError() << "padding_idx " << padding.getInt() << " must be a row of the table (>= 0)";
  if (int64_t offset = getRowOffset().getInt(); offset < 0)
    return emitOpError() << "row_offset " << offset << " must be >= 0";
  SmallVector<int64_t> expected(ids.getShape());
  expected.push_back(table.getDimSize(1));
  if (ArrayRef<int64_t>(expected) != getResult().getType().getShape() ||
      table.getElementType() != getResult().getType().getElementType())
    return emitOpError() << "result must be " << RankedTensorType::get(expected, table.getElementType());
  return success();
}

LogicalResult ScatterAddOp::verify() {
  auto result = getResult().getType();
  if (result.getRank() != 2) return emitOpError() << "result must be a 2-D table [rows, width]";
  SmallVector<int64_t> expected(getIds().getType().getShape());
  expected.push_back(result.getDimSize(1));
  if (getUpdates().getType().getShape() != ArrayRef<int64_t>(expected) ||
      !isWideningResult(getUpdates().getType().getElementType(), result.getElementType()))
    return emitOpError() << "updates must be " << RankedTensorType::get(expected, result.getElementType())
                         << " (or 16-bit for an f32 table)";
  // skip_id is a global row, which may lie in another rank's block of the table.
  if (auto skip = getSkipIdAttr(); skip && skip.getInt() < 0)
    return emitOpError() << "skip_id " << skip.getInt() << " must be a row of the table (>= 0)";
  if (int64_t offset = getRowOffset().getInt(); offset < 0)
    return emitOpError() << "row_offset " << offset << " must be >= 0";
  return success();
}

namespace {
// The key and stream rules shared by the random ops: one [2] key for the whole result, or one key
// per row of the result's dimension 0.
LogicalResult verifyRandomOp(Operation* op, RankedTensorType key, int64_t stream, RankedTensorType result) {
  bool wholeKey = key.getShape() == ArrayRef<int64_t>{2};
  bool rowKeys = key.getRank() == 2 && key.getDimSize(1) == 2;
  if (!wholeKey && !rowKeys)
    return op->emitOpError() << "key must be tensor<2xi64> (seed, offset) or tensor<Nx2xi64> (one per row), got " << key;
  if (stream < 0) return op->emitOpError() << "stream must be >= 0";
  if (!result.hasStaticShape()) return op->emitOpError() << "result must have a static shape";
  if (rowKeys && (result.getRank() < 1 || result.getDimSize(0) != key.getDimSize(0)))
    return op->emitOpError() << "a key per row needs a result of shape [" << key.getDimSize(0) << ", ...], got " << result;
  return success();
}
}  // namespace

LogicalResult RandomUniformOp::verify() {
  return verifyRandomOp(*this, getKey().getType(), getStreamAttr().getInt(), getResult().getType());
}

Value RandomUniformOp::getRandomKey() { return getKey(); }
int64_t RandomUniformOp::getStreamId() { return getStreamAttr().getInt(); }

LogicalResult RandomIntOp::verify() {
  // Results are drawn from one 32-bit Philox word each.
  constexpr int64_t kMaxHigh = int64_t{1} << 32;
  int64_t high = getHighAttr().getInt();
  if (high < 1 || high > kMaxHigh) return emitOpError() << "high " << high << " must be in [1, 2^32]";
  return verifyRandomOp(*this, getKey().getType(), getStreamAttr().getInt(), getResult().getType());
}

Value RandomIntOp::getRandomKey() { return getKey(); }
int64_t RandomIntOp::getStreamId() { return getStreamAttr().getInt(); }

#define GET_OP_CLASSES
#include "dialects/dg/IR/DgOps.cpp.inc"
