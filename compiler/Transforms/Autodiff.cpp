#include "compiler/Transforms/Passes.h"
#include "plan/Names.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGAUTODIFF
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

bool isTrainableParam(Value value) {
  auto param = value.getDefiningOp<ParamOp>();
  return param && param.getTrainable() && isa<FloatType>(param.getType().getElementType());
}

class FunctionDifferentiator {
 public:
  FunctionDifferentiator(func::FuncOp function, OutputOp lossOutput)
      : function_(function), loss_(lossOutput), builder_(function.getContext()) {}

  LogicalResult run() {
    Value loss = loss_.getValue();
    auto lossType = cast<RankedTensorType>(loss.getType());
    if (lossType.getNumElements() != 1 || !isa<FloatType>(lossType.getElementType()))
      return loss_.emitOpError() << "can only differentiate a single-element float output, got " << lossType;

    Block& body = function_.getBody().front();
    markActive(body, loss);
    builder_.setInsertionPoint(body.getTerminator());
    cotangents_[loss] = builder_.create<FillOp>(loss_.getLoc(), lossType, builder_.getF64FloatAttr(1.0));

    SmallVector<Operation*> forward;
    for (Operation& op : body) forward.push_back(&op);
    for (Operation* op : llvm::reverse(forward))
      if (failed(differentiate(op))) return failure();
    emitGradientOutputs(body);
    return success();
  }

 private:
  // Active values are both reached from a trainable parameter and reaching the loss; only ops that
  // produce them are differentiated. A stop_gradient result counts as a constant, so nothing is
  // differentiated through that use of its input.
  void markActive(Block& body, Value loss) {
    llvm::DenseSet<Value> varied;
    for (Operation& op : body) {
      if (isa<StopGradientOp>(op)) continue;
      bool fromParam = llvm::any_of(op.getResults(), isTrainableParam) ||
                       llvm::any_of(op.getOperands(), [&](Value v) { return varied.contains(v); });
      // Integer results (top-k indices, ids) are discrete: they never carry a gradient.
      if (fromParam)
        for (Value result : op.getResults())
          if (isa<FloatType>(cast<RankedTensorType>(result.getType()).getElementType())) varied.insert(result);
    }
    SmallVector<Value> worklist{loss};
    while (!worklist.empty()) {
      Value value = worklist.pop_back_val();
      if (!varied.contains(value) || !active_.insert(value).second) continue;
      if (Operation* def = value.getDefiningOp()) worklist.append(def->operand_begin(), def->operand_end());
    }
  }

  LogicalResult differentiate(Operation* op) {
    if (isa<ParamOp>(op) || llvm::none_of(op->getResults(), [&](Value r) { return cotangents_.count(r); })) return success();
    auto derivative = dyn_cast<DerivativeOpInterface>(op);
    if (!derivative)
      return op->emitOpError() << "has no derivative rule, but lies between the trainable parameters and '"
                               << loss_.getName() << "'";
    SmallVector<Value> resultCotangents;
    for (Value result : op->getResults()) {
      Value cotangent = cotangents_.lookup(result);
      // A float result nothing depends on gets zeros; an integer result (indices) has no cotangent.
      if (!cotangent && isa<FloatType>(cast<RankedTensorType>(result.getType()).getElementType()))
        cotangent = builder_.create<FillOp>(op->getLoc(), result.getType(), builder_.getF64FloatAttr(0.0));
      resultCotangents.push_back(cotangent);
    }
    SmallVector<Value> operandCotangents;
    if (failed(derivative.buildVjp(builder_, resultCotangents, operandCotangents))) return failure();
    if (operandCotangents.size() != op->getNumOperands())
      return op->emitOpError() << "derivative rule returned " << operandCotangents.size() << " cotangents for "
                               << op->getNumOperands() << " operands";
    for (auto [operand, cotangent] : llvm::zip(op->getOperands(), operandCotangents))
      if (cotangent && active_.contains(operand)) accumulate(operand, cotangent, op->getLoc());
    return success();
  }

  void accumulate(Value value, Value cotangent, Location loc) {
    Value& slot = cotangents_[value];
    slot = slot ? builder_.create<AddOp>(loc, value.getType(), slot, cotangent).getResult() : cotangent;
  }

  // One output per trainable parameter name; several ops naming one parameter add up.
  void emitGradientOutputs(Block& body) {
    llvm::MapVector<StringRef, Value> gradients;
    llvm::StringMap<ParamOp> params;
    for (Operation& op : body) {
      auto param = dyn_cast<ParamOp>(op);
      if (!param || !isTrainableParam(param)) continue;
      params.try_emplace(param.getName(), param);
      Value cotangent = cotangents_.lookup(param.getResult());
      Value& slot = gradients[param.getName()];
      if (cotangent) slot = slot ? builder_.create<AddOp>(param.getLoc(), param.getType(), slot, cotangent).getResult() : cotangent;
    }
    for (auto& [name, gradient] : gradients) {
      ParamOp param = params.lookup(name);
      if (!gradient) gradient = builder_.create<FillOp>(param.getLoc(), param.getType(), builder_.getF64FloatAttr(0.0));
      builder_.create<OutputOp>(param.getLoc(), builder_.getStringAttr(dgemma::kGradientPrefix + name.str()), gradient);
    }
  }

  func::FuncOp function_;
  OutputOp loss_;
  OpBuilder builder_;
  llvm::DenseSet<Value> active_;
  llvm::DenseMap<Value, Value> cotangents_;
};

struct DgAutodiffPass : mlir::dg::impl::DgAutodiffBase<DgAutodiffPass> {
  using DgAutodiffBase::DgAutodiffBase;

  void runOnOperation() override {
    bool foundLoss = false;
    WalkResult result = getOperation().walk([&](func::FuncOp function) -> WalkResult {
      if (!function->hasAttr(kEntryAttr)) return WalkResult::advance();
      OutputOp lossOutput;
      function.walk([&](OutputOp output) {
        if (output.getName() == lossName) lossOutput = output;
      });
      if (!lossOutput) return WalkResult::advance();
      foundLoss = true;
      return failed(FunctionDifferentiator(function, lossOutput).run()) ? WalkResult::interrupt() : WalkResult::advance();
    });
    if (result.wasInterrupted()) return signalPassFailure();
    if (!foundLoss) {
      getOperation().emitError() << "dg-autodiff: no entry point has an output named '" << lossName << "'";
      signalPassFailure();
    }
  }
};

}  // namespace
