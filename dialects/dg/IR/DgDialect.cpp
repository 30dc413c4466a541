#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgMesh.h"
#include "dialects/dg/IR/DgRecompute.h"

#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"

using namespace mlir;
using namespace mlir::dg;

#include "dialects/dg/IR/DgOpsDialect.cpp.inc"

void DgDialect::initialize() {
  registerAttributes();
  addOperations<
#define GET_OP_LIST
#include "dialects/dg/IR/DgOps.cpp.inc"
      >();
}

namespace {

LogicalResult verifyPositiveSizes(Operation* op, StringRef attrName, Attribute attr) {
  auto dictionary = dyn_cast<DictionaryAttr>(attr);
  if (!dictionary) return op->emitOpError() << "'" << attrName << "' must be a dictionary of axis/dimension sizes";
  for (NamedAttribute entry : dictionary) {
    auto size = dyn_cast<IntegerAttr>(entry.getValue());
    if (!size || size.getInt() < 1)
      return op->emitOpError() << "'" << attrName << "' entry '" << entry.getName().getValue()
                               << "' must be an integer >= 1";
  }
  return success();
}

// A clone dg-recompute made of `original` (marked dg.recomputed, the same op on the same operands):
// it draws the same numbers again, which is what recomputation must do.
bool isRecomputedCopy(Operation* op, Operation* original) {
  if (!op->hasAttr(kRecomputedAttr) || op->getName() != original->getName() ||
      !llvm::equal(op->getOperands(), original->getOperands()) ||
      !llvm::equal(op->getResultTypes(), original->getResultTypes()))
    return false;
  std::optional<RegisteredOperationName> name = op->getRegisteredInfo();
  return name && llvm::all_of(name->getAttributeNames(), [&](StringAttr attribute) {
           return op->getInherentAttr(attribute) == original->getInherentAttr(attribute);
         });
}

// An entry point takes nothing and returns nothing (dg.input / dg.output carry its interface), hands
// each output out once, and draws each random stream once.
LogicalResult verifyEntryFunction(func::FuncOp function) {
  if (function.getNumArguments() != 0 || function.getNumResults() != 0)
    return function.emitOpError() << "entry point must take no arguments and return nothing "
                                     "(use dg.input / dg.output)";
  llvm::StringMap<Operation*> outputs;
  llvm::DenseMap<std::pair<Value, int64_t>, Operation*> randomStreams;
  WalkResult result = function.walk([&](Operation* op) -> WalkResult {
    if (auto output = dyn_cast<OutputOp>(op)) {
      auto [it, inserted] = outputs.try_emplace(output.getName(), op);
      if (!inserted) {
        output.emitOpError() << "output '" << output.getName() << "' is already produced"
                             << " in this entry point";
        return WalkResult::interrupt();
      }
    }
    if (auto random = dyn_cast<RandomOpInterface>(op)) {
      auto [it, inserted] = randomStreams.try_emplace({random.getRandomKey(), random.getStreamId()}, op);
      if (!inserted && !isRecomputedCopy(op, it->second)) {
        op->emitOpError() << "draws the same numbers as an earlier random op (same key and stream "
                          << random.getStreamId() << ")";
        return WalkResult::interrupt();
      }
    }
    return WalkResult::advance();
  });
  return failure(result.wasInterrupted());
}

// dg.global_shape and dg.shard_offset: together, on the boundary ops, a box of the global tensor
// that has the local type's shape.
LogicalResult verifyBox(Operation* op, StringRef name) {
  Value value;
  if (auto param = dyn_cast<ParamOp>(op)) value = param.getResult();
  else if (auto input = dyn_cast<InputOp>(op)) value = input.getResult();
  else if (auto output = dyn_cast<OutputOp>(op)) value = output.getValue();
  else return op->emitOpError() << "'" << name << "' belongs on dg.param, dg.input or dg.output";
  auto globalShape = op->getAttrOfType<DenseI64ArrayAttr>(kGlobalShapeAttr);
  auto offset = op->getAttrOfType<DenseI64ArrayAttr>(kShardOffsetAttr);
  if (!globalShape || !offset)
    return op->emitOpError() << "'" << kGlobalShapeAttr << "' and '" << kShardOffsetAttr
                             << "' must both be present, as arrays of i64";
  ArrayRef<int64_t> local = cast<RankedTensorType>(value.getType()).getShape();
  if (globalShape.size() != static_cast<int64_t>(local.size()) || offset.size() != static_cast<int64_t>(local.size()))
    return op->emitOpError() << "'" << name << "' must hold one entry per dimension (" << local.size() << ")";
  for (auto [dim, size] : llvm::enumerate(local))
    if (offset[dim] < 0 || offset[dim] + size > globalShape[dim])
      return op->emitOpError() << "the box [" << offset[dim] << ", " << offset[dim] + size << ") of dimension " << dim
                               << " does not fit its global size " << globalShape[dim];
  return success();
}

// A parameter name denotes one tensor across the module. Each entry point is checked against the
// functions before it (and itself), so a conflict is reported once, at its later occurrence.
LogicalResult verifyParameterTypes(ModuleOp module, func::FuncOp function) {
  llvm::StringMap<ParamOp> first;
  for (auto candidate : module.getOps<func::FuncOp>()) {
    WalkResult result = candidate.walk([&](ParamOp param) -> WalkResult {
      auto [it, inserted] = first.try_emplace(param.getName(), param);
      if (!inserted && it->second.getType() != param.getType() && candidate == function) {
        param.emitOpError() << "parameter '" << param.getName() << "' has type " << param.getType()
                            << " here but " << it->second.getType() << " elsewhere in the module";
        return WalkResult::interrupt();
      }
      return WalkResult::advance();
    });
    if (result.wasInterrupted()) return failure();
    if (candidate == function) break;
  }
  return success();
}

// One #dg.sharding per value (result or operand), each fitting the value's type and the module's mesh.
LogicalResult verifyShardings(Operation* op, StringRef name, Attribute attribute, ValueRange values, StringRef what) {
  auto shardings = dyn_cast<ArrayAttr>(attribute);
  if (!shardings || shardings.size() != values.size())
    return op->emitOpError() << "'" << name << "' must hold one #dg.sharding per " << what;
  Mesh mesh = Mesh::of(op->getParentOfType<ModuleOp>());
  for (auto [index, entry, value] : llvm::enumerate(shardings, values)) {
    auto sharding = dyn_cast<ShardingAttr>(entry);
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (!sharding || !type) return op->emitOpError() << "'" << name << "' entry " << index << " must be a #dg.sharding of a tensor";
    if (failed(mesh.verify(sharding, type, [&]() { return op->emitOpError() << what << " " << index << ": "; })))
      return failure();
  }
  return success();
}

}  // namespace

LogicalResult DgDialect::verifyOperationAttribute(Operation* op, NamedAttribute attribute) {
  StringRef name = attribute.getName().getValue();
  if (name == kEntryAttr) {
    auto function = dyn_cast<func::FuncOp>(op);
    if (!function) return op->emitOpError() << "'" << name << "' belongs on a func.func";
    if (!isa<StringAttr>(attribute.getValue())) return op->emitOpError() << "'" << name << "' must be a string";
    if (failed(verifyEntryFunction(function))) return failure();
    if (auto module = op->getParentOfType<ModuleOp>()) return verifyParameterTypes(module, function);
    return success();
  }
  if (name == kBucketAttr) {
    if (!isa<func::FuncOp>(op) || !op->hasAttr(kEntryAttr))
      return op->emitOpError() << "'" << name << "' belongs on an entry point (a func.func with dg.entry)";
    return verifyPositiveSizes(op, name, attribute.getValue());
  }
  if (name == kMeshAttr) {
    if (!isa<ModuleOp>(op)) return op->emitOpError() << "'" << name << "' belongs on the module";
    if (!isa<MeshAttr>(attribute.getValue()))
      return op->emitOpError() << "'" << name << "' must be a #dg.mesh<[name = size (role), ...]>";
    return success();
  }
  if (name == kOffsetsAttr) {
    auto offsets = dyn_cast<DenseI64ArrayAttr>(attribute.getValue());
    if (!offsets || offsets.size() != static_cast<int64_t>(op->getNumResults()))
      return op->emitOpError() << "'" << name << "' must hold one offset per result";
    for (auto [offset, result] : llvm::zip(offsets.asArrayRef(), op->getResults()))
      if (offset < 0 && !(offset == -1 && inPlaceAssignTarget(result)))
        return op->emitOpError() << "'" << name << "' must hold offsets >= 0, or -1 for a result stored in a parameter";
    return success();
  }
  if (name == kShardingsAttr) return verifyShardings(op, name, attribute.getValue(), op->getResults(), "result");
  if (name == kOperandShardingsAttr)
    return verifyShardings(op, name, attribute.getValue(), op->getOperands(), "operand");
  if (name == kRoleAttr) {
    auto role = dyn_cast<StringAttr>(attribute.getValue());
    if (!isa<ParamOp>(op)) return op->emitOpError() << "'" << name << "' belongs on a dg.param";
    if (!role || !llvm::is_contained({kRoleVocab, kRoleColumn, kRoleRow, kRoleExperts, kRoleReplicated}, role.getValue()))
      return op->emitOpError() << "'" << name << "' must be one of \"vocab\", \"column\", \"row\", \"experts\", \"replicated\"";
    return success();
  }
  if (name == kHeadsAttr) {
    auto heads = dyn_cast<IntegerAttr>(attribute.getValue());
    if (!isa<ParamOp>(op)) return op->emitOpError() << "'" << name << "' belongs on a dg.param";
    if (!heads || heads.getInt() < 1)
      return op->emitOpError() << "'" << name << "' must be a head count (an integer >= 1)";
    return success();
  }
  if (name == kGlobalShapeAttr || name == kShardOffsetAttr) return verifyBox(op, name);
  if (name == kPendingSumAttr || name == kFrozenBaseAttr) {
    if (!isa<ParamOp>(op) || !isa<UnitAttr>(attribute.getValue()))
      return op->emitOpError() << "'" << name << "' is a unit attribute of dg.param";
    return success();
  }
  if (name == kLayerBeginAttr || name == kLayerEndAttr) {
    auto layer = dyn_cast<IntegerAttr>(attribute.getValue());
    if (!layer || !layer.getType().isInteger(64) || layer.getInt() < 0)
      return op->emitOpError() << "'" << name << "' must be a layer index (an i64 >= 0)";
    if (op->getNumResults() == 0) return op->emitOpError() << "'" << name << "' belongs on an op with results";
    return success();
  }
  if (name == kContextSplitAttr) {
    if (!isa<UnitAttr>(attribute.getValue()) || op->getNumResults() == 0)
      return op->emitOpError() << "'" << name << "' is a unit attribute of an op with results";
    return success();
  }
  if (name == kRecomputedAttr) {
    if (!isa<UnitAttr>(attribute.getValue())) return op->emitOpError() << "'" << name << "' is a unit attribute";
    return success();
  }
  if (name == kScratchBytesAttr || name == kCommBufferBytesAttr) {
    auto bytes = dyn_cast<IntegerAttr>(attribute.getValue());
    if (!bytes || bytes.getInt() < 0) return op->emitOpError() << "'" << name << "' must be a non-negative integer";
    return success();
  }
  return op->emitOpError() << "unknown dg attribute '" << name << "'";
}
