// dg-f32-gradient-accumulation: in a bf16 step, each use of a parameter casts the f32 master to
// bf16, so autodiff hands out a bf16 gradient per use, sums them in bf16 and widens the sum for
// grad/<name>. This pass moves that tail to f32, as Megatron accumulates into fp32 main_grad
// buffers (docs/training.md, "Mixed precision"): walking back from every gradient output through the widening casts,
// a sum is redone in f32 on widened operands, a transpose or reshape on its widened input, and the
// op that produced a gradient (a matmul, reduce_sum, scatter_add, or moe_experts_backward's weight
// gradients) writes its f32 accumulator instead of rounding it. Each rewrite removes a rounding and
// adds none. The forward pass is left alone: its roundings are the model's definition (HF rounds
// the head's output to bf16, for one).
#include "dialects/dg/IR/DgOps.h"
#include "compiler/Transforms/Passes.h"
#include "plan/Names.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGF32GRADIENTACCUMULATION
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

RankedTensorType withElement(Type type, Type element) {
  return RankedTensorType::get(cast<RankedTensorType>(type).getShape(), element);
}

class GradientWidener {
 public:
  explicit GradientWidener(OpBuilder& builder) : b_(builder) {}

  // `value` is f32 and flows only into a gradient: widen what produces it.
  void visit(Value value) {
    Operation* producer = value.getDefiningOp();
    if (!producer) return;
    if (isa<AddOp, SubOp>(producer)) {
      for (Value operand : producer->getOperands()) visit(operand);
      return;
    }
    if (auto widening = dyn_cast<CastOp>(producer)) absorb(widening);
  }

 private:
  // cast(x: 16-bit -> f32) where x has no other use: compute x in f32.
  void absorb(CastOp widening) {
    Value narrow = widening.getInput();
    Type wide = widening.getResult().getType().getElementType();
    Operation* producer = narrow.getDefiningOp();
    if (!producer || !narrow.hasOneUse() || narrow.getType() == widening.getResult().getType() ||
        !isWideningResult(cast<RankedTensorType>(narrow.getType()).getElementType(), wide))
      return;
    if (isa<AddOp, SubOp, TransposeOp, ReshapeOp>(producer)) {
      // Redo the op in f32 on widened operands (exact for the layout ops), then widen those.
      b_.setInsertionPoint(producer);
      SmallVector<CastOp> operands;
      for (Value operand : producer->getOperands())
        operands.push_back(b_.create<CastOp>(producer->getLoc(), withElement(operand.getType(), wide), operand));
      SmallVector<Value> widenedOperands(operands.begin(), operands.end());
      Operation* redone = b_.create(producer->getLoc(), producer->getName().getIdentifier(), widenedOperands,
                                    {widening.getResult().getType()}, producer->getAttrs());
      widening.getResult().replaceAllUsesWith(redone->getResult(0));
      widening.erase();
      producer->erase();
      for (CastOp operand : operands) absorb(operand);
      return;
    }
    // Ops that accumulate in f32 anyway: write the f32 accumulator instead of rounding it.
    const bool accumulates = isa<MatmulOp, ReduceSumOp, ScatterAddOp>(producer) ||
                             (isa<MoeExpertsBackwardOp>(producer) && cast<OpResult>(narrow).getResultNumber() >= 2);
    if (!accumulates) return;
    narrow.setType(widening.getResult().getType());
    widening.getResult().replaceAllUsesWith(narrow);
    widening.erase();
  }

  OpBuilder& b_;
};

struct DgF32GradientAccumulationPass
    : mlir::dg::impl::DgF32GradientAccumulationBase<DgF32GradientAccumulationPass> {
  void runOnOperation() override {
    OpBuilder builder(&getContext());
    GradientWidener widener(builder);
    SmallVector<OutputOp> gradients;
    getOperation().walk([&](OutputOp output) {
      if (output.getName().starts_with(dgemma::kGradientPrefix)) gradients.push_back(output);
    });
    for (OutputOp output : gradients)
      if (cast<RankedTensorType>(output.getValue().getType()).getElementType().isF32()) widener.visit(output.getValue());
  }
};

}  // namespace
