#include "compiler/Conversion/DgToPlan/DgToPlan.h"

#include <cstring>

#include "dialects/dg/IR/DgMesh.h"
#include "dialects/dg/IR/DgOps.h"
#include "llvm/ADT/TypeSwitch.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "plan/HostArena.h"
#include "plan/PlanFile.h"

using namespace mlir;
using namespace mlir::dg;
using dgemma::Buffer;
using dgemma::DType;

namespace {

// The plan's memory pools, one arena each (docs/plan-format.md, "Header": arenas); the empty ones are
// dropped when the plan is complete.
enum ArenaIndex : int64_t {
  kParametersArena,     // the model's parameters (persistent)
  kGradientsArena,      // grad/ buffers (persistent)
  kOptimizerArena,      // optimizer/ state: the AdamW moments (persistent)
  kRunStateArena,       // cache/ and generate/: an inference plan's run state (persistent)
  kConstantsArena,      // dg.constant values (persistent)
  kActivationsArena,    // every other value an entry computes (scratch, dg.scratch_bytes)
  kCommunicationArena,  // the collectives' own results (scratch, dg.comm_buffer_bytes)
  kHostArena,           // host memory: offloaded AdamW moments and their update's staging (persistent)
  kArenaCount,
};
constexpr uint64_t kAlignment = 64;

// The parameter whose optimizer state `name` is ("optimizer/<moment>/<parameter>", plan/Names.h).
StringRef optimizerStateOwner(StringRef name) {
  return name.drop_front(StringRef(dgemma::kOptimizerStatePrefix).size()).split('/').second;
}

// The persistent pool a parameter's buffer belongs to, by its name (plan/Names.h).
int64_t persistentArenaOf(StringRef name, const std::set<std::string>& offloaded) {
  if (name.starts_with(dgemma::kGradientPrefix)) return kGradientsArena;
  if (name.starts_with(dgemma::kOptimizerStatePrefix))
    return offloaded.count(optimizerStateOwner(name).str()) ? kHostArena : kOptimizerArena;
  if (dgemma::isRunState(std::string_view(name.data(), name.size()))) return kRunStateArena;
  return kParametersArena;
}

std::optional<DType> dtypeOf(Type elementType) {
  if (elementType.isF32()) return DType::F32;
  if (elementType.isF64()) return DType::F64;
  if (elementType.isBF16()) return DType::BF16;
  if (elementType.isF16()) return DType::F16;
  if (elementType.isInteger(64)) return DType::I64;
  if (elementType.isInteger(32)) return DType::I32;
  if (elementType.isUnsignedInteger(8)) return DType::U8;  // packed NF4 codes (dg.dequantize)
  if (elementType.isInteger(8)) return DType::I8;
  if (elementType.isInteger(1)) return DType::Bool;
  return std::nullopt;
}

std::string locationText(Location loc) {
  if (auto fileLoc = dyn_cast<FileLineColLoc>(loc))
    return fileLoc.getFilename().str() + ":" + std::to_string(fileLoc.getLine()) + ":" + std::to_string(fileLoc.getColumn());
  if (auto nameLoc = dyn_cast<NameLoc>(loc)) return nameLoc.getName().str();
  if (auto fused = dyn_cast<FusedLoc>(loc))
    return fused.getLocations().empty() ? std::string() : locationText(fused.getLocations().front());
  return {};
}

constexpr StringLiteral kOperandSegmentSizes = "operandSegmentSizes";
constexpr StringLiteral kResultSegmentSizes = "resultSegmentSizes";

// A DefaultValuedOptionalAttr keeps its absence in the IR (the passes read a present offset as a
// sharded op), so the op may lack it; the ODS getter gives its default, which the step still carries.
void addOptionalDefaults(Operation* op, nlohmann::json& attrs) {
  llvm::TypeSwitch<Operation*>(op)
      .Case<GatherOp, ScatterAddOp>([&](auto rowOp) { attrs["row_offset"] = rowOp.getRowOffset().getInt(); })
      .Case<MoeExpertsOp, MoeExpertsBackwardOp>([&](auto expertOp) {
        attrs["expert_offset"] = expertOp.getExpertOffset().getInt();
        // Which of the optional buffers the step lists: several are optional, so their count alone
        // cannot say (runtime/kernels/moe/Contract.h).
        attrs["lora_gate_up"] = static_cast<bool>(expertOp.getLoraGateUpA());
        attrs["lora_down"] = static_cast<bool>(expertOp.getLoraDownA());
      })
      // Both optional key inputs are [B, Tk] i64, so their count alone cannot say which is there
      // (runtime/kernels/attention/Contract.h).
      .Case<AttentionOp, AttentionBackwardOp>(
          [&](auto attention) { attrs["has_document_ids"] = static_cast<bool>(attention.getDocumentIds()); });
  if (auto backward = dyn_cast<MoeExpertsBackwardOp>(op)) {
    attrs["grad_gate_up"] = static_cast<bool>(backward.getGradGateUp());
    attrs["grad_down"] = static_cast<bool>(backward.getGradDown());
  }
  if (auto backward = dyn_cast<MoeLocalExpertsBackwardOp>(op)) {
    attrs["grad_gate_up"] = static_cast<bool>(backward.getGradGateUp());
    attrs["grad_down"] = static_cast<bool>(backward.getGradDown());
  }
}

// Inherent attributes become step attributes, those left at their default included (DefaultValuedAttr
// ones are set when the op is created), so the runtime's contracts hold no default of their own
// (docs/plan-format.md, "Header"); discardable ones (dg.offsets, ...) stay in the IR. An attribute of
// a kind the plan cannot encode is an error at the op, not a step without it.
FailureOr<nlohmann::json> attributesToJson(Operation* op) {
  nlohmann::json attrs = nlohmann::json::object();
  addOptionalDefaults(op, attrs);
  for (NamedAttribute named : op->getAttrs()) {
    StringRef name = named.getName().getValue();
    if (name.contains('.')) continue;
    // Which optional operands and results the op has: the step's buffer lists say it already.
    if (name == kOperandSegmentSizes || name == kResultSegmentSizes) continue;
    Attribute value = named.getValue();
    if (auto boolean = dyn_cast<BoolAttr>(value)) attrs[name.str()] = boolean.getValue();
    else if (auto integer = dyn_cast<IntegerAttr>(value)) attrs[name.str()] = integer.getInt();
    else if (auto real = dyn_cast<FloatAttr>(value)) attrs[name.str()] = real.getValueAsDouble();
    else if (auto text = dyn_cast<StringAttr>(value)) attrs[name.str()] = text.getValue().str();
    else if (auto list = dyn_cast<DenseI64ArrayAttr>(value)) attrs[name.str()] = std::vector<int64_t>(list.asArrayRef());
    // Enums are written as their keywords, the strings the runtime's kernels read.
    else if (auto mask = dyn_cast<AttentionMaskAttr>(value)) attrs[name.str()] = stringifyAttentionMask(mask.getValue()).str();
    else if (auto predicate = dyn_cast<ComparePredicateAttr>(value))
      attrs[name.str()] = stringifyComparePredicate(predicate.getValue()).str();
    else if (auto reduction = dyn_cast<ReductionKindAttr>(value))
      attrs[name.str()] = stringifyReductionKind(reduction.getValue()).str();
    else {
      op->emitOpError() << "attribute '" << name << "' = " << value
                        << " has no plan encoding (expected a bool, integer, float, string, dense i64 array "
                           "or dg enum attribute)";
      return failure();
    }
  }
  return attrs;
}

// Row-major bytes of a dense constant in the plan's element encoding.
std::vector<uint8_t> constantBytes(DenseElementsAttr value, DType dtype) {
  std::vector<uint8_t> bytes(value.getNumElements() * dgemma::dtypeSize(dtype));
  size_t elementBytes = dgemma::dtypeSize(dtype);
  size_t index = 0;
  auto store = [&](uint64_t bits) { std::memcpy(bytes.data() + elementBytes * index++, &bits, elementBytes); };
  if (isa<FloatType>(value.getElementType())) {
    for (APFloat element : value.getValues<APFloat>()) store(element.bitcastToAPInt().getZExtValue());
  } else {
    for (APInt element : value.getValues<APInt>()) store(element.getZExtValue());
  }
  return bytes;
}

class PlanBuilder {
 public:
  PlanBuilder(ModuleOp module, const PlanLoweringOptions& options)
      : module_(module), rank_(options.rank), offloaded_(options.offloadedParameters) {
    plan_.producer = options.producer;
    plan_.metadata = options.metadata;
    plan_.arenas = {{"parameters", true, 0, kAlignment},     {"gradients", true, 0, kAlignment},
                    {"optimizer", true, 0, kAlignment},      {"run_state", true, 0, kAlignment},
                    {"constants", true, 0, kAlignment},      {"activations", false, 0, kAlignment},
                    {"communication", false, 0, kAlignment}, {dgemma::kHostArenaName, true, 0, kAlignment}};
    plan_.sections.push_back({"constants", {}});
  }

  FailureOr<dgemma::Plan> build() {
    if (failed(lowerMesh())) return failure();
    if (failed(declareParameters())) return failure();
    for (auto function : module_.getOps<func::FuncOp>())
      if (function->hasAttr(kEntryAttr) && failed(lowerEntry(function))) return failure();
    if (plan_.entryPoints.empty()) {
      module_.emitError() << "no entry point (func.func with dg.entry) to lower";
      return failure();
    }
    dropEmptyArenas();
    return std::move(plan_);
  }

 private:
  // Every parameter of the entry points, in name order. The ranks of a sharded plan walk the
  // parameter list together when they assemble gradients and checkpoints, so its order must not
  // follow op positions: passes may schedule a rank's ops differently from another's (dg-memory-plan
  // moves each update to just after its operands), and a rank's program need not match rank 0's.
  LogicalResult declareParameters() {
    std::map<std::string, ParamOp> byName;
    for (auto function : module_.getOps<func::FuncOp>())
      if (function->hasAttr(kEntryAttr)) function.walk([&](ParamOp param) { byName.try_emplace(param.getName().str(), param); });
    for (auto& [name, param] : byName)
      if (failed(parameterBuffer(param))) return failure();
    return success();
  }

  LogicalResult lowerMesh() {
    int64_t worldSize = 1;
    const Mesh mesh = Mesh::of(module_);
    for (const Mesh::Axis& axis : mesh.axes()) {
      plan_.mesh.push_back({axis.name, axis.size, 0});
      worldSize *= axis.size;
    }
    if (!rank_) {
      if (worldSize == 1) return success();
      module_.emitError() << "the mesh has " << worldSize
                          << " ranks: lower each rank's program (dg-shard-partition) with the rank it is for";
      return failure();
    }
    if (*rank_ < 0 || *rank_ >= worldSize) {
      module_.emitError() << "rank " << *rank_ << " is outside the mesh's " << worldSize << " ranks";
      return failure();
    }
    plan_.worldSize = worldSize;
    plan_.rank = *rank_;
    int64_t remaining = *rank_;
    for (auto axis = plan_.mesh.rbegin(); axis != plan_.mesh.rend(); ++axis) {
      axis->coord = remaining % axis->size;
      remaining /= axis->size;
    }
    return success();
  }

  // The runtime allocates exactly the plan's arenas: pools that hold no bytes are left out, and a
  // zero-byte buffer of such a pool moves to offset 0 of a kept arena of the same kind (an empty
  // pool is kept only when no arena of its kind is).
  void dropEmptyArenas() {
    const size_t count = plan_.arenas.size();
    std::vector<bool> keep(count), used(count);
    for (size_t i = 0; i < count; ++i) keep[i] = plan_.arenas[i].bytes > 0;
    for (const Buffer& buffer : plan_.buffers) used[buffer.arena] = true;
    auto keptOfKind = [&](const dgemma::Arena& kind) -> std::optional<size_t> {
      for (size_t i = 0; i < count; ++i)
        if (keep[i] && plan_.arenas[i].persistent == kind.persistent &&
            dgemma::isHostArena(plan_.arenas[i]) == dgemma::isHostArena(kind))
          return i;
      return std::nullopt;
    };
    for (size_t i = 0; i < count; ++i)
      if (used[i] && !keep[i] && !keptOfKind(plan_.arenas[i])) keep[i] = true;
    std::vector<int64_t> newIndex(count, -1);
    std::vector<dgemma::Arena> kept;
    for (size_t i = 0; i < count; ++i)
      if (keep[i]) {
        newIndex[i] = static_cast<int64_t>(kept.size());
        kept.push_back(plan_.arenas[i]);
      }
    for (Buffer& buffer : plan_.buffers) {
      if (!keep[buffer.arena]) {
        buffer.arena = static_cast<int64_t>(*keptOfKind(plan_.arenas[buffer.arena]));
        buffer.offset = 0;
      }
      buffer.arena = newIndex[buffer.arena];
    }
    plan_.arenas = std::move(kept);
  }

  FailureOr<int64_t> addBuffer(Operation* op, Value value, const std::string& name, int64_t arena, uint64_t offset) {
    auto type = cast<RankedTensorType>(value.getType());
    auto dtype = dtypeOf(type.getElementType());
    if (!dtype) {
      op->emitOpError() << "element type " << type.getElementType() << " has no plan dtype";
      return failure();
    }
    Buffer buffer;
    buffer.id = static_cast<int64_t>(plan_.buffers.size());
    buffer.name = name;
    buffer.dtype = *dtype;
    buffer.shape.assign(type.getShape().begin(), type.getShape().end());
    buffer.arena = arena;
    buffer.offset = offset;
    plan_.buffers.push_back(buffer);
    return buffer.id;
  }

  // Persistent buffers are appended to their pool's arena, each 64-byte aligned.
  FailureOr<int64_t> addPersistent(Operation* op, Value value, const std::string& name, int64_t arena) {
    uint64_t offset = (plan_.arenas[arena].bytes + kAlignment - 1) / kAlignment * kAlignment;
    auto id = addBuffer(op, value, name, arena, offset);
    if (succeeded(id)) plan_.arenas[arena].bytes = offset + plan_.buffers[*id].bytes();
    return id;
  }

  // A parameter's init spec: strings, numbers, integers, i64 arrays (a quantized part's logical shape) and nested
  // specs (its base init), docs/plan-format.md, "Header".
  static nlohmann::json initToJson(DictionaryAttr init) {
    nlohmann::json json = nlohmann::json::object();
    for (NamedAttribute field : init) {
      const std::string key = field.getName().str();
      if (auto text = dyn_cast<StringAttr>(field.getValue())) json[key] = text.getValue().str();
      else if (auto real = dyn_cast<FloatAttr>(field.getValue())) json[key] = real.getValueAsDouble();
      else if (auto integer = dyn_cast<IntegerAttr>(field.getValue())) json[key] = integer.getInt();  // logical_rows
      else if (auto ints = dyn_cast<DenseI64ArrayAttr>(field.getValue()))
        json[key] = std::vector<int64_t>(ints.asArrayRef());
      else if (auto nested = dyn_cast<DictionaryAttr>(field.getValue())) json[key] = initToJson(nested);
    }
    return json;
  }

  FailureOr<int64_t> parameterBuffer(ParamOp param) {
    auto found = parameterBuffers_.find(param.getName().str());
    if (found != parameterBuffers_.end()) return found->second;
    auto id =
        addPersistent(param, param.getResult(), param.getName().str(), persistentArenaOf(param.getName(), offloaded_));
    if (failed(id)) return failure();
    dgemma::Parameter parameter;
    parameter.name = param.getName().str();
    parameter.buffer = *id;
    parameter.shardShape = plan_.buffers[*id].shape;
    Box box = boxOf(param, parameter.shardShape);
    parameter.globalShape = box.globalShape;
    parameter.shardOffset = box.shardOffset;
    parameter.trainable = param.getTrainable();
    parameter.pendingSum = param->hasAttr(kPendingSumAttr);
    parameter.init = nlohmann::json::object();
    if (auto init = param.getInitAttr()) parameter.init = initToJson(init);
    plan_.parameters.push_back(parameter);
    parameterBuffers_[parameter.name] = *id;
    return *id;
  }

  struct Box {
    std::vector<int64_t> globalShape;
    std::vector<int64_t> shardOffset;
    bool isWhole(const std::vector<int64_t>& localShape) const { return globalShape == localShape; }
  };
  // The box dg-shard-partition recorded on a boundary op; without one the value is whole.
  static Box boxOf(Operation* op, const std::vector<int64_t>& localShape) {
    auto globalShape = op->getAttrOfType<DenseI64ArrayAttr>(kGlobalShapeAttr);
    auto offset = op->getAttrOfType<DenseI64ArrayAttr>(kShardOffsetAttr);
    if (!globalShape || !offset) return {localShape, std::vector<int64_t>(localShape.size(), 0)};
    return {std::vector<int64_t>(globalShape.asArrayRef().begin(), globalShape.asArrayRef().end()),
            std::vector<int64_t>(offset.asArrayRef().begin(), offset.asArrayRef().end())};
  }
  // An entry's input or output: a box only when it is part of a larger tensor (docs/plan-format.md).
  dgemma::NamedBuffer namedBuffer(Operation* op, const std::string& name, int64_t id) const {
    dgemma::NamedBuffer named(name, id);
    Box box = boxOf(op, plan_.buffers[id].shape);
    if (!box.isWhole(plan_.buffers[id].shape)) {
      named.globalShape = box.globalShape;
      named.shardOffset = box.shardOffset;
    }
    return named;
  }

  FailureOr<int64_t> constantBuffer(ConstantOp constant) {
    auto dense = dyn_cast<DenseElementsAttr>(constant.getValue());
    if (!dense) {
      constant.emitOpError() << "only dense constants can be stored in a plan";
      return failure();
    }
    auto id = addPersistent(constant, constant.getResult(), "constant", kConstantsArena);
    if (failed(id)) return failure();
    std::vector<uint8_t>& section = plan_.sections[0].data;
    std::vector<uint8_t> bytes = constantBytes(dense, plan_.buffers[*id].dtype);
    plan_.constants.push_back({*id, 0, section.size(), bytes.size()});
    section.insert(section.end(), bytes.begin(), bytes.end());
    return *id;
  }

  FailureOr<int64_t> scratchBuffer(Operation* op, Value value, const std::string& name) {
    auto offsets = op->getAttrOfType<DenseI64ArrayAttr>(kOffsetsAttr);
    if (!offsets) {
      op->emitOpError() << "has no dg.offsets: run dg-memory-plan before lowering to a plan";
      return failure();
    }
    unsigned index = cast<OpResult>(value).getResultNumber();
    return addBuffer(op, value, name, isCommunicationBuffer(value) ? kCommunicationArena : kActivationsArena,
                     offsets[index]);
  }

  LogicalResult lowerEntry(func::FuncOp function) {
    dgemma::EntryPoint entry;
    entry.name = function->getAttrOfType<StringAttr>(kEntryAttr).getValue().str();
    if (auto bucket = function->getAttrOfType<DictionaryAttr>(kBucketAttr))
      for (NamedAttribute dimension : bucket) entry.bucket[dimension.getName().str()] = cast<IntegerAttr>(dimension.getValue()).getInt();
    const std::string key = entry.key();
    auto scratchBytes = function->getAttrOfType<IntegerAttr>(kScratchBytesAttr);
    auto commBufferBytes = function->getAttrOfType<IntegerAttr>(kCommBufferBytesAttr);
    if (!scratchBytes || !commBufferBytes)
      return function.emitOpError() << "has no dg.scratch_bytes or dg.comm_buffer_bytes: run dg-memory-plan before lowering";
    // Only one entry runs at a time: each scratch pool is as large as the largest entry's need.
    plan_.arenas[kActivationsArena].bytes = std::max<uint64_t>(plan_.arenas[kActivationsArena].bytes, scratchBytes.getInt());
    plan_.arenas[kCommunicationArena].bytes =
        std::max<uint64_t>(plan_.arenas[kCommunicationArena].bytes, commBufferBytes.getInt());

    llvm::DenseMap<Value, int64_t> bufferOf;
    // Scratch storage (non-view buffers) and the steps that touch them, for lifetimes.
    std::map<int64_t, std::pair<int64_t, int64_t>> liveSteps;
    std::vector<std::pair<int64_t, int64_t>> views;  // (view buffer, viewed buffer)
    auto touch = [&](int64_t id, int64_t step) {
      const Buffer& buffer = plan_.buffers[id];
      int64_t owner = buffer.aliasOf ? *buffer.aliasOf : id;
      if (plan_.buffers[owner].arena != kActivationsArena && plan_.buffers[owner].arena != kCommunicationArena) return;
      auto [it, inserted] = liveSteps.try_emplace(owner, step, step);
      it->second.first = std::min(it->second.first, step);
      it->second.second = std::max(it->second.second, step);
    };
    std::vector<int64_t> outputBuffers;

    for (Operation& op : function.getBody().front()) {
      if (isa<func::ReturnOp>(op)) continue;
      FailureOr<int64_t> id = failure();
      if (auto param = dyn_cast<ParamOp>(op)) {
        id = parameterBuffer(param);
      } else if (auto constant = dyn_cast<ConstantOp>(op)) {
        id = constantBuffer(constant);
      } else if (auto input = dyn_cast<InputOp>(op)) {
        id = scratchBuffer(&op, input.getResult(), input.getName().str());
        if (succeeded(id)) {
          entry.inputs.push_back(namedBuffer(input, input.getName().str(), *id));
          touch(*id, 0);
        }
      } else if (auto output = dyn_cast<OutputOp>(op)) {
        entry.outputs.push_back(namedBuffer(output, output.getName().str(), bufferOf.lookup(output.getValue())));
        outputBuffers.push_back(bufferOf.lookup(output.getValue()));
        continue;
      } else if (auto assign = dyn_cast<AssignOp>(op)) {
        // The parameter's persistent bytes take the value: a plain copy into them, unless the value
        // was computed in place there (inPlaceAssignTarget).
        int64_t stepIndex = static_cast<int64_t>(entry.steps.size());
        int64_t from = bufferOf.lookup(assign.getValue());
        if (from == bufferOf.lookup(assign.getTarget())) continue;
        touch(from, stepIndex);
        entry.steps.push_back(copyStep(from, bufferOf.lookup(assign.getTarget()), locationText(op.getLoc())));
        continue;
      } else if (isa<ReshapeOp, StopGradientOp>(op)) {
        // Both keep their input's bytes in row-major order: a view of the same storage.
        const Buffer viewed = plan_.buffers[bufferOf.lookup(op.getOperand(0))];
        int64_t owner = viewed.aliasOf ? *viewed.aliasOf : viewed.id;
        id = addBuffer(&op, op.getResult(0), viewed.name + ".view", viewed.arena, viewed.offset);
        if (succeeded(id)) {
          plan_.buffers[*id].aliasOf = owner;
          views.push_back({*id, owner});
        }
      } else {
        dgemma::Step step;
        step.kind = isa<CommunicationOpInterface>(op) ? dgemma::Step::Kind::Collective : dgemma::Step::Kind::Kernel;
        step.op = op.getName().stripDialect().str();
        FailureOr<nlohmann::json> attrs = attributesToJson(&op);
        if (failed(attrs)) return failure();
        step.attrs = std::move(*attrs);
        if (step.kind == dgemma::Step::Kind::Collective) {
          step.axis = step.attrs["axis"].get<std::string>();
          step.attrs.erase("axis");
        }
        step.location = locationText(op.getLoc());
        int64_t stepIndex = static_cast<int64_t>(entry.steps.size());
        for (Value operand : op.getOperands()) {
          step.inputs.push_back(bufferOf.lookup(operand));
          touch(step.inputs.back(), stepIndex);
        }
        if (auto update = dyn_cast<AdamwOp>(op);
            update && plan_.buffers[bufferOf.lookup(update.getExpAvg())].arena == kHostArena) {
          if (failed(lowerHostUpdate(update, std::move(step), entry, bufferOf, touch))) return failure();
          continue;
        }
        if (isInPlaceCollective(&op)) {
          // These collectives work in place. When their input is still needed, or is a parameter
          // or constant, they work on a copy (the memory planner gave the result its own bytes).
          if (!collectiveWorksInPlace(&op)) {
            auto copyId = scratchBuffer(&op, op.getResult(0), step.op);
            if (failed(copyId)) return failure();
            entry.steps.push_back(copyStep(step.inputs[0], *copyId, step.location));
            touch(*copyId, stepIndex);
            ++stepIndex;
            step.inputs = {*copyId};
            touch(*copyId, stepIndex);
          }
          step.outputs = step.inputs;
          bufferOf[op.getResult(0)] = step.inputs[0];
          entry.steps.push_back(std::move(step));
          continue;
        }
        for (Value result : op.getResults()) {
          if (Value target = inPlaceAssignTarget(result)) {
            bufferOf[result] = bufferOf.lookup(target);
            step.outputs.push_back(bufferOf[result]);
            continue;
          }
          auto resultId = scratchBuffer(&op, result, step.op);
          if (failed(resultId)) return failure();
          bufferOf[result] = *resultId;
          step.outputs.push_back(*resultId);
          touch(*resultId, stepIndex);
        }
        entry.steps.push_back(std::move(step));
        continue;
      }
      if (failed(id)) return failure();
      bufferOf[op.getResult(0)] = *id;
    }

    int64_t lastStep = std::max<int64_t>(static_cast<int64_t>(entry.steps.size()) - 1, 0);
    for (int64_t id : outputBuffers) touch(id, lastStep);
    for (const auto& [id, steps] : liveSteps) plan_.buffers[id].lifetime = dgemma::Lifetime{key, steps.first, steps.second};
    for (const auto& [view, owner] : views) plan_.buffers[view].lifetime = plan_.buffers[owner].lifetime;
    plan_.entryPoints.push_back(std::move(entry));
    return success();
  }

  // An offloaded parameter's AdamW update runs on the host (docs/parallelism.md, "Optimizer-state
  // offload"): its moments already live in the host arena; every other operand (the gradient, the
  // per-step scalars, a ZeRO-1 slice of the weights) is copied into a host staging buffer first,
  // the update runs on those copies with the same kernel and attributes, and the updated weights
  // are copied back to the device buffer the plan reads them from. Weights updated in place have a
  // host master instead, which the runtime keeps equal to the device copy (plan/HostArena.h), so
  // they are not copied in. The copies are plain copy steps: the CPU backend runs them as memcpy,
  // a GPU runtime as device<->host transfers.
  template <typename Touch>
  LogicalResult lowerHostUpdate(AdamwOp update, dgemma::Step step, dgemma::EntryPoint& entry,
                                llvm::DenseMap<Value, int64_t>& bufferOf, Touch& touch) {
    auto stageOf = [&](Value value, int64_t deviceBuffer) -> FailureOr<int64_t> {
      return addPersistent(update, value, dgemma::kHostCopyPrefix + plan_.buffers[deviceBuffer].name, kHostArena);
    };
    const bool hostMaster = inPlaceAssignTarget(update.getNewParam()) == update.getParam();
    for (auto [index, operand] : llvm::enumerate(update->getOperands())) {
      int64_t source = step.inputs[index];
      if (plan_.buffers[source].arena == kHostArena) continue;
      FailureOr<int64_t> stage = stageOf(operand, source);
      if (failed(stage)) return failure();
      step.inputs[index] = *stage;
      if (hostMaster && operand == update.getParam()) continue;
      touch(source, static_cast<int64_t>(entry.steps.size()));
      entry.steps.push_back(copyStep(source, *stage, step.location));
    }
    // Each result is computed into host memory: in place where its operand's host copy is (the
    // weights' stage, the moments), else into a stage of its own; a result the device reads is
    // copied back after the update.
    std::vector<std::pair<int64_t, int64_t>> copiesBack;  // (host result, device buffer)
    const Value updatedOperands[] = {update.getParam(), update.getExpAvg(), update.getExpAvgSq()};
    for (auto [index, result] : llvm::enumerate(update->getResults())) {
      int64_t device;
      int64_t host;
      if (Value target = inPlaceAssignTarget(result)) {
        device = bufferOf.lookup(target);
        OperandRange operands = update->getOperands();
        host = step.inputs[llvm::find(operands, updatedOperands[index]) - operands.begin()];
      } else {
        FailureOr<int64_t> scratch = scratchBuffer(update, result, step.op);
        if (failed(scratch)) return failure();
        device = *scratch;
        FailureOr<int64_t> stage = stageOf(result, device);
        if (failed(stage)) return failure();
        host = *stage;
      }
      bufferOf[result] = device;
      step.outputs.push_back(host);
      if (device != host) copiesBack.push_back({host, device});
    }
    const std::string location = step.location;
    entry.steps.push_back(std::move(step));
    for (auto [host, device] : copiesBack) {
      touch(device, static_cast<int64_t>(entry.steps.size()));
      entry.steps.push_back(copyStep(host, device, location));
    }
    return success();
  }

  static dgemma::Step copyStep(int64_t from, int64_t to, const std::string& location) {
    dgemma::Step step;
    step.op = "copy";
    step.inputs = {from};
    step.outputs = {to};
    step.location = location;
    return step;
  }

  ModuleOp module_;
  std::optional<int64_t> rank_;  // PlanLoweringOptions::rank
  dgemma::Plan plan_;
  std::map<std::string, int64_t> parameterBuffers_;
  const std::set<std::string>& offloaded_;  // PlanLoweringOptions::offloadedParameters
};

}  // namespace

FailureOr<dgemma::Plan> mlir::dg::lowerToPlan(ModuleOp module, const PlanLoweringOptions& options) {
  return PlanBuilder(module, options).build();
}

bool mlir::dg::lowersToKernelStep(RegisteredOperationName name) {
  if (name.hasInterface<CommunicationOpInterface>()) return false;
  return !llvm::is_contained({ParamOp::getOperationName(), ConstantOp::getOperationName(), InputOp::getOperationName(),
                              OutputOp::getOperationName(), AssignOp::getOperationName(), ReshapeOp::getOperationName(),
                              StopGradientOp::getOperationName()},
                             name.getStringRef());
}
