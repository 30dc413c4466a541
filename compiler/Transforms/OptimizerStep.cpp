// dg-optimizer-step: adds the "optimizer_step" entry point, the AdamW update of every trainable
// parameter as dg ops (docs/training.md, "AdamW and clipping"): the global norm and clip as scalar
// ops, then one fused dg.adamw per parameter and dg.assign of its results, so that later passes
// (sharding: the distributed optimizer; memory planning) see the update like any other computation.
#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/StringSet.h"
#include "plan/Names.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGOPTIMIZERSTEP
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

// Every trainable float parameter of the module's entry points, once per name, in first-use order.
SmallVector<ParamOp> trainableParameters(ModuleOp module) {
  SmallVector<ParamOp> params;
  llvm::StringSet<> seen;
  module.walk([&](ParamOp param) {
    if (param.getTrainable() && isa<FloatType>(param.getType().getElementType()) && seen.insert(param.getName()).second)
      params.push_back(param);
  });
  return params;
}

class UpdateBuilder {
 public:
  UpdateBuilder(OpBuilder& builder, Location loc) : b_(builder), loc_(loc) {}

  Value scalar(double value, Type element) {
    return b_.create<FillOp>(loc_, RankedTensorType::get({}, element), b_.getF64FloatAttr(value));
  }
  template <typename Op>
  Value binary(Value lhs, Value rhs) {
    auto lhsType = cast<RankedTensorType>(lhs.getType());
    auto shape = *broadcastShapes(lhsType.getShape(), cast<RankedTensorType>(rhs.getType()).getShape());
    return b_.create<Op>(loc_, RankedTensorType::get(shape, lhsType.getElementType()), lhs, rhs);
  }
  Value sumOfSquares(Value x) {
    auto type = cast<RankedTensorType>(x.getType());
    SmallVector<int64_t> dims = llvm::to_vector(llvm::seq<int64_t>(0, type.getRank()));
    return b_.create<ReduceSumOp>(loc_, RankedTensorType::get({}, type.getElementType()), binary<MulOp>(x, x),
                                  b_.getDenseI64ArrayAttr(dims), b_.getBoolAttr(false));
  }
  Value state(StringRef prefix, ParamOp param) {
    SmallVector<NamedAttribute> fields{b_.getNamedAttr("kind", b_.getStringAttr("zeros"))};
    // A padded weight's moments are padded alike (docs/parallelism.md, "Vocabulary padding").
    if (DictionaryAttr paramInit = param.getInitAttr(); paramInit && paramInit.get("logical_rows"))
      fields.push_back(b_.getNamedAttr("logical_rows", paramInit.get("logical_rows")));
    auto init = b_.getDictionaryAttr(fields);
    return b_.create<ParamOp>(loc_, param.getType(), b_.getStringAttr(prefix + param.getName()), init, b_.getBoolAttr(false));
  }
  Value parameter(ParamOp param) {
    return b_.create<ParamOp>(loc_, param.getType(), param.getNameAttr(), param.getInitAttr(), b_.getBoolAttr(true));
  }
  Value input(const std::string& name, Type type) { return b_.create<InputOp>(loc_, type, b_.getStringAttr(name)); }

 private:
  OpBuilder& b_;
  Location loc_;
};

struct DgOptimizerStepPass : mlir::dg::impl::DgOptimizerStepBase<DgOptimizerStepPass> {
  using DgOptimizerStepBase::DgOptimizerStepBase;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    SmallVector<ParamOp> params = trainableParameters(module);
    if (params.empty()) {
      module.emitError() << "dg-optimizer-step: the module has no trainable parameter";
      return signalPassFailure();
    }
    OpBuilder builder(module.getContext());
    builder.setInsertionPointToEnd(module.getBody());
    Location loc = NameLoc::get(builder.getStringAttr("optimizer_step"));
    auto function = builder.create<func::FuncOp>(loc, "optimizer_step", builder.getFunctionType({}, {}));
    function->setAttr(kEntryAttr, builder.getStringAttr("optimizer_step"));
    function->setAttr(kBucketAttr, builder.getDictionaryAttr({}));
    builder.setInsertionPointToStart(function.addEntryBlock());
    UpdateBuilder u(builder, loc);
    Type f32 = builder.getF32Type();
    auto scalarType = RankedTensorType::get({}, f32);

    // Host-computed per-step scalars: the scheduled rate and Adam's bias corrections 1 - β^n (fp64
    // on the host, rounded once), and the scale that turns summed micro-batch gradients into a mean.
    Value lr = u.input("lr", scalarType);
    Value correction1 = u.input("bias_correction1", scalarType);
    Value correction2 = u.input("bias_correction2", scalarType);
    Value gradientScale = u.input("gradient_scale", scalarType);

    SmallVector<Value> gradients;
    Value squares;
    for (ParamOp param : params) {
      Value gradient = u.input(std::string(dgemma::kGradientPrefix) + param.getName().str(), param.getType());
      Value sum = u.sumOfSquares(gradient);
      if (sum.getType() != scalarType) sum = builder.create<CastOp>(loc, scalarType, sum);
      squares = squares ? u.binary<AddOp>(squares, sum) : sum;
      gradients.push_back(gradient);
    }
    // The norm of the mean gradient (the scale is positive), and Megatron's clip: scale by
    // max / (‖g‖ + 1e-6) only when that is below 1. Both scales reach the update as one scalar.
    Value norm = u.binary<MulOp>(builder.create<SqrtOp>(loc, scalarType, squares), gradientScale);
    builder.create<OutputOp>(loc, "grad_norm", norm);
    Value shiftedNorm = u.binary<AddOp>(norm, u.scalar(1e-6, f32));
    Value coefficient = u.binary<DivOp>(u.scalar(maxGradNorm, f32), shiftedNorm);
    Value clip = u.binary<MinimumOp>(coefficient, u.scalar(1.0, f32));
    Value combinedScale = u.binary<MulOp>(gradientScale, clip);

    for (auto [param, gradient] : llvm::zip(params, gradients)) {
      Type element = param.getType().getElementType();
      auto cast = [&](Value value) { return element == f32 ? value : builder.create<CastOp>(loc, RankedTensorType::get({}, element), value).getResult(); };
      Value weights = u.parameter(param);
      Value firstMoment = u.state(std::string(dgemma::kOptimizerStatePrefix) + "exp_avg/", param);
      Value secondMoment = u.state(std::string(dgemma::kOptimizerStatePrefix) + "exp_avg_sq/", param);
      auto update = builder.create<AdamwOp>(loc, param.getType(), param.getType(), param.getType(), weights, gradient,
                                            firstMoment, secondMoment, cast(combinedScale), cast(lr), cast(correction1),
                                            cast(correction2), builder.getF64FloatAttr(beta1), builder.getF64FloatAttr(beta2),
                                            builder.getF64FloatAttr(epsilon), builder.getF64FloatAttr(weightDecay));
      builder.create<AssignOp>(loc, weights, update.getNewParam());
      builder.create<AssignOp>(loc, firstMoment, update.getNewExpAvg());
      builder.create<AssignOp>(loc, secondMoment, update.getNewExpAvgSq());
    }
    builder.create<func::ReturnOp>(loc);
  }
};

}  // namespace
