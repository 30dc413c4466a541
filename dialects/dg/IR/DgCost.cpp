// FLOP counts of the dg ops (CostOpInterface). A multiply-add is 2 FLOPs; a transcendental
// function counts as 1 (the count is for reports and scheduling, not a hardware model).
#include "dialects/dg/IR/DgOps.h"

using namespace mlir;
using namespace mlir::dg;

namespace {
int64_t elementsOf(Value value) { return cast<RankedTensorType>(value.getType()).getNumElements(); }
int64_t resultElements(Operation* op) { return elementsOf(op->getResult(0)); }
}  // namespace

int64_t ParamOp::getFlops() { return 0; }
int64_t InputOp::getFlops() { return 0; }
int64_t ConstantOp::getFlops() { return 0; }
int64_t FillOp::getFlops() { return 0; }
int64_t CastOp::getFlops() { return 0; }
int64_t TransposeOp::getFlops() { return 0; }
int64_t ReshapeOp::getFlops() { return 0; }
int64_t GatherOp::getFlops() { return 0; }

int64_t AddOp::getFlops() { return resultElements(*this); }
int64_t SubOp::getFlops() { return resultElements(*this); }
int64_t MulOp::getFlops() { return resultElements(*this); }
int64_t DivOp::getFlops() { return resultElements(*this); }
int64_t MaximumOp::getFlops() { return resultElements(*this); }
int64_t MinimumOp::getFlops() { return resultElements(*this); }
int64_t NegOp::getFlops() { return resultElements(*this); }
int64_t ExpOp::getFlops() { return resultElements(*this); }
int64_t LogOp::getFlops() { return resultElements(*this); }
int64_t TanhOp::getFlops() { return resultElements(*this); }
int64_t SqrtOp::getFlops() { return resultElements(*this); }
int64_t RsqrtOp::getFlops() { return resultElements(*this); }
// x^3, two multiply-adds, tanh, add, two multiplies.
int64_t GeluTanhOp::getFlops() { return 8 * resultElements(*this); }
// Square-accumulate (2), scale (1), weight (1).
int64_t RmsNormOp::getFlops() { return 4 * resultElements(*this); }
// Max, subtract, exp, sum, divide.
int64_t SoftmaxOp::getFlops() { return 5 * resultElements(*this); }
int64_t ReduceSumOp::getFlops() { return elementsOf(getInput()); }
int64_t ReduceMeanOp::getFlops() { return elementsOf(getInput()); }
int64_t ReduceMaxOp::getFlops() { return elementsOf(getInput()); }
int64_t RandomUniformOp::getFlops() { return 0; }

int64_t MatmulOp::getFlops() {
  auto lhs = getLhs().getType();
  int64_t k = lhs.getDimSize(lhs.getRank() - (getTransposeA() ? 2 : 1));
  return 2 * resultElements(*this) * k;
}
