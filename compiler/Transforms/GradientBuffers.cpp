// dg-gradient-buffers: gradient accumulation on the device. Each gradient output grad/<name> of an
// entry point (train_step's buckets) becomes an add into the persistent, zero-initialised f32
// buffer grad/<name> (a non-trainable parameter, written back with dg.assign); optimizer_step reads
// those buffers instead of taking gradients as inputs and zeroes them after the update. Two small
// entry points complete the contract: gradient_check (is every buffer finite, before an update is
// applied) and zero_gradients (discard a skipped step's sums). Summing in micro-batch order into a
// zeroed f32 buffer gives the same bits as the host loop it replaces (docs/training.md).
#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/MapVector.h"
#include "plan/Names.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGGRADIENTBUFFERS
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

bool isGradientName(StringRef name) { return name.starts_with(dgemma::kGradientPrefix); }

// The f32 accumulator of a gradient of type `gradient`.
RankedTensorType bufferTypeOf(RankedTensorType gradient) {
  return RankedTensorType::get(gradient.getShape(), Float32Type::get(gradient.getContext()));
}

Value readBuffer(OpBuilder& builder, Location loc, StringRef name, RankedTensorType type) {
  auto zeros = builder.getDictionaryAttr({builder.getNamedAttr("kind", builder.getStringAttr("zeros"))});
  return builder.create<ParamOp>(loc, type, builder.getStringAttr(name), zeros, builder.getBoolAttr(false));
}

Value castTo(OpBuilder& builder, Location loc, Value value, RankedTensorType type) {
  return value.getType() == type ? value : builder.create<CastOp>(loc, type, value).getResult();
}

void zeroBuffer(OpBuilder& builder, Location loc, Value buffer) {
  Value zeros = builder.create<FillOp>(loc, buffer.getType(), builder.getF64FloatAttr(0.0));
  builder.create<AssignOp>(loc, buffer, zeros);
}

func::FuncOp createEntry(OpBuilder& builder, ModuleOp module, StringRef name) {
  builder.setInsertionPointToEnd(module.getBody());
  Location loc = NameLoc::get(builder.getStringAttr(name));
  auto function = builder.create<func::FuncOp>(loc, name, builder.getFunctionType({}, {}));
  function->setAttr(kEntryAttr, builder.getStringAttr(name));
  function->setAttr(kBucketAttr, builder.getDictionaryAttr({}));
  builder.setInsertionPointToStart(function.addEntryBlock());
  return function;
}

struct DgGradientBuffersPass : mlir::dg::impl::DgGradientBuffersBase<DgGradientBuffersPass> {
  void runOnOperation() override {
    ModuleOp module = getOperation();
    func::FuncOp optimizerStep;
    for (auto function : module.getOps<func::FuncOp>())
      if (auto entry = function->getAttrOfType<StringAttr>(kEntryAttr); entry && entry.getValue() == "optimizer_step")
        optimizerStep = function;
    if (!optimizerStep) {
      module.emitError() << "dg-gradient-buffers: no optimizer_step entry point (run dg-optimizer-step first)";
      return signalPassFailure();
    }
    // The buffers, in optimizer_step's input order: the gradient types it takes.
    SmallVector<InputOp> gradientInputs;
    llvm::MapVector<StringRef, RankedTensorType> gradients;
    optimizerStep.walk([&](InputOp input) {
      if (!isGradientName(input.getName())) return;
      gradientInputs.push_back(input);
      gradients[input.getName()] = cast<RankedTensorType>(input.getType());
    });
    if (gradients.empty()) {
      optimizerStep.emitError() << "dg-gradient-buffers: optimizer_step takes no " << dgemma::kGradientPrefix << " input";
      return signalPassFailure();
    }
    OpBuilder builder(module.getContext());
    for (auto function : llvm::make_early_inc_range(module.getOps<func::FuncOp>()))
      if (function != optimizerStep && function->hasAttr(kEntryAttr) && failed(accumulateOutputs(builder, function, gradients)))
        return signalPassFailure();
    readBuffersIn(builder, optimizerStep, gradientInputs);
    addGradientCheck(builder, module, gradients);
    addZeroGradients(builder, module, gradients);
  }

  // grad/<name> outputs become buffer += gradient (in f32).
  LogicalResult accumulateOutputs(OpBuilder& builder, func::FuncOp function,
                                  const llvm::MapVector<StringRef, RankedTensorType>& gradients) {
    SmallVector<OutputOp> outputs;
    function.walk([&](OutputOp output) {
      if (isGradientName(output.getName())) outputs.push_back(output);
    });
    for (OutputOp output : outputs) {
      auto it = gradients.find(output.getName());
      auto type = cast<RankedTensorType>(output.getValue().getType());
      if (it == gradients.end() || it->second != type)
        return output.emitError() << "dg-gradient-buffers: optimizer_step takes no " << output.getName() << " of type " << type;
      builder.setInsertionPoint(output);
      Location loc = output.getLoc();
      RankedTensorType bufferType = bufferTypeOf(type);
      Value buffer = readBuffer(builder, loc, output.getName(), bufferType);
      Value sum = builder.create<AddOp>(loc, bufferType, buffer, castTo(builder, loc, output.getValue(), bufferType));
      builder.create<AssignOp>(loc, buffer, sum);
      output.erase();
    }
    return success();
  }

  // optimizer_step's grad/<name> inputs become reads of the buffers, zeroed after the update.
  void readBuffersIn(OpBuilder& builder, func::FuncOp optimizerStep, ArrayRef<InputOp> inputs) {
    SmallVector<std::pair<Location, Value>> buffers;
    for (InputOp input : inputs) {
      builder.setInsertionPoint(input);
      Location loc = input.getLoc();
      auto type = cast<RankedTensorType>(input.getType());
      Value buffer = readBuffer(builder, loc, input.getName(), bufferTypeOf(type));
      input.getResult().replaceAllUsesWith(castTo(builder, loc, buffer, type));
      input.erase();
      buffers.push_back({loc, buffer});
    }
    builder.setInsertionPoint(optimizerStep.getBody().front().getTerminator());
    for (auto [loc, buffer] : buffers) zeroBuffer(builder, loc, buffer);
  }

  // gradient_check outputs nonfinite/grad/<name> = sum(g - g): 0 for a finite buffer, NaN when an
  // element is NaN or infinite. (A norm would overflow for large finite gradients.)
  void addGradientCheck(OpBuilder& builder, ModuleOp module, const llvm::MapVector<StringRef, RankedTensorType>& gradients) {
    func::FuncOp function = createEntry(builder, module, dgemma::kGradientCheckEntry);
    Location loc = function.getLoc();
    auto scalar = RankedTensorType::get({}, builder.getF32Type());
    for (const auto& [name, type] : gradients) {
      RankedTensorType bufferType = bufferTypeOf(type);
      Value buffer = readBuffer(builder, loc, name, bufferType);
      Value zeroWhenFinite = builder.create<SubOp>(loc, bufferType, buffer, buffer);
      SmallVector<int64_t> dims = llvm::to_vector(llvm::seq<int64_t>(0, bufferType.getRank()));
      Value sum = dims.empty() ? zeroWhenFinite
                               : builder.create<ReduceSumOp>(loc, scalar, zeroWhenFinite, builder.getDenseI64ArrayAttr(dims),
                                                             builder.getBoolAttr(false))
                                     .getResult();
      builder.create<OutputOp>(loc, builder.getStringAttr(std::string(dgemma::kNonFinitePrefix) + name.str()), sum);
    }
    builder.create<func::ReturnOp>(loc);
  }

  void addZeroGradients(OpBuilder& builder, ModuleOp module, const llvm::MapVector<StringRef, RankedTensorType>& gradients) {
    func::FuncOp function = createEntry(builder, module, dgemma::kZeroGradientsEntry);
    Location loc = function.getLoc();
    for (const auto& [name, type] : gradients) zeroBuffer(builder, loc, readBuffer(builder, loc, name, bufferTypeOf(type)));
    builder.create<func::ReturnOp>(loc);
  }
};

}  // namespace
