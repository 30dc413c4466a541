// dg-keep-expert-activations (docs/training.md, "Expert activations"): a dg.moe_experts_backward
// computes each route's gate and up pre-activations again from the experts' input, a product as
// large as the forward's first one. Where its forward is in the same program, the forward hands them
// over instead (its `gate_up_rows` result), as an autograd engine saves a linear's output for the
// activation's derivative. The backward then runs four products per expert instead of five and its
// results are the same bytes.
//
// The pairing follows what dg-recompute left: the forward is the last dg.moe_experts before the
// backward with the same operands, so a recomputed clone (which reads the same operands or their
// clones) is chosen over the original, and the rows live from the clone to the backward right after
// it; without recomputation they live from the forward to the backward, like every other activation.
// The rows are [N·k, 2I] whatever the block of experts holds, so the pass keeps them only where the
// op holds every expert its routing chooses among: not in expert parallelism's all-gather form,
// where all but a block's share of them would be zero rows.
#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGKEEPEXPERTACTIVATIONS
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

bool computesSameExperts(MoeExpertsOp forward, MoeExpertsBackwardOp backward) {
  return forward.getInput() == backward.getInput() && forward.getWeights() == backward.getWeights() &&
         forward.getIndices() == backward.getIndices() && forward.getGateUp() == backward.getGateUp() &&
         forward.getDown() == backward.getDown() && forward.getExpertOffset() == backward.getExpertOffset() &&
         forward.getLoraGateUpA() == backward.getLoraGateUpA() &&
         forward.getLoraGateUpB() == backward.getLoraGateUpB() && forward.getLoraDownA() == backward.getLoraDownA() &&
         forward.getLoraDownB() == backward.getLoraDownB() && forward.getLoraScaleAttr() == backward.getLoraScaleAttr();
}

// The last dg.moe_experts before `backward` in its block that computes what it differentiates.
MoeExpertsOp closestForward(MoeExpertsBackwardOp backward) {
  MoeExpertsOp closest;
  for (Operation* user : backward.getInput().getUsers()) {
    auto forward = dyn_cast<MoeExpertsOp>(user);
    if (!forward || forward->getBlock() != backward->getBlock() || !forward->isBeforeInBlock(backward) ||
        !computesSameExperts(forward, backward))
      continue;
    if (!closest || closest->isBeforeInBlock(forward)) closest = forward;
  }
  return closest;
}

// Whether every route has its expert in the op: the indices are a dg.moe_route's choice among as
// many experts as gate_up holds.
bool holdsEveryChosenExpert(MoeExpertsOp forward) {
  auto route = forward.getIndices().getDefiningOp<MoeRouteOp>();
  return route && route.getLogits().getType().getDimSize(1) == forward.getGateUp().getType().getDimSize(0);
}

// The forward's pre-activations, giving it the result first where it has none (the op is replaced).
Value gateUpRowsOf(MoeExpertsOp forward) {
  if (Value rows = forward.getGateUpRows()) return rows;
  const int64_t routes = forward.getWeights().getType().getNumElements();
  const int64_t width = forward.getGateUp().getType().getDimSize(1);
  auto rowsType =
      RankedTensorType::get({routes, width}, gateUpRowsElementType(forward.getInput().getType().getElementType()));
  OpBuilder builder(forward);
  auto kept = builder.create<MoeExpertsOp>(forward.getLoc(), TypeRange{forward.getResult().getType(), rowsType},
                                           forward->getOperands(), forward->getAttrs());
  forward.getResult().replaceAllUsesWith(kept.getResult());
  forward.erase();
  return kept.getGateUpRows();
}

struct DgKeepExpertActivationsPass : mlir::dg::impl::DgKeepExpertActivationsBase<DgKeepExpertActivationsPass> {
  void runOnOperation() override {
    SmallVector<MoeExpertsBackwardOp> backwards;
    getOperation().walk([&](MoeExpertsBackwardOp backward) {
      if (!backward.getGateUpRows()) backwards.push_back(backward);
    });
    for (MoeExpertsBackwardOp backward : backwards) {
      MoeExpertsOp forward = closestForward(backward);
      if (!forward || !holdsEveryChosenExpert(forward)) continue;
      backward.getGateUpRowsMutable().assign(gateUpRowsOf(forward));
    }
  }
};

}  // namespace
