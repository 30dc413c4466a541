// FLOP counts of the dg ops (CostOpInterface). A multiply-add is 2 FLOPs; a transcendental
// function counts as 1 (the count is for reports and scheduling, not a hardware model).
#include "dialects/dg/IR/DgOps.h"
#include "plan/FusedElementwiseProgram.h"

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
// One multiply per element (code or table value times its scale).
int64_t DequantizeOp::getFlops() { return resultElements(*this); }
int64_t TransposeOp::getFlops() { return 0; }
int64_t ReshapeOp::getFlops() { return 0; }
int64_t GatherOp::getFlops() { return 0; }
int64_t ScatterAddOp::getFlops() { return getUpdates().getType().getNumElements(); }
int64_t ConcatOp::getFlops() { return 0; }
int64_t SliceOp::getFlops() { return 0; }

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
int64_t RandomIntOp::getFlops() { return 0; }
int64_t StopGradientOp::getFlops() { return 0; }
int64_t CompareOp::getFlops() { return resultElements(*this); }
int64_t SelectOp::getFlops() { return 0; }
// Per logit: bonus, max, subtract, exp, sum.
int64_t CrossEntropyOp::getFlops() { return 5 * elementsOf(getLogits()); }
// Per logit: the forward's five, then divide, subtract the one-hot and scale.
int64_t CrossEntropyBackwardOp::getFlops() { return 8 * elementsOf(getLogits()); }
// Per logit: divide, max, subtract, exp, sum, the entropy's multiply-add, and the Gumbel noise's two
// logs and add; the soft-cap's divide, tanh and multiply when it caps.
int64_t CanvasSampleOp::getFlops() {
  return (getSoftcap().convertToDouble() > 0 ? 13 : 10) * elementsOf(getLogits());
}
// Each instruction as its op counts it (gelu_tanh 8, cast and select 0, the others 1) per element.
int64_t FusedElementwiseOp::getFlops() {
  std::string error;
  const auto program = dgemma::fused::parseProgram(getProgram(), getInputs().size(), error);
  if (!program) return 0;  // the verifier reports it
  int64_t perElement = 0;
  for (const dgemma::fused::Instruction& instruction : program->instructions) {
    switch (instruction.opcode) {
      case dgemma::fused::Opcode::GeluTanh: perElement += 8; break;
      case dgemma::fused::Opcode::Cast:
      case dgemma::fused::Opcode::Select: break;
      default: perElement += 1;
    }
  }
  return perElement * resultElements(*this);
}
int64_t AdamwOp::getFlops() { return 14 * elementsOf(getParam()); }
int64_t RmsNormBackwardOp::getFlops() { return 10 * elementsOf(getInput()); }

int64_t MatmulOp::getFlops() {
  auto lhs = getLhs().getType();
  int64_t k = lhs.getDimSize(lhs.getRank() - (getTransposeA() ? 2 : 1));
  return 2 * resultElements(*this) * k;
}

// Rotate-half: two multiplies and one add per output element of the rotated dims.
int64_t RopeOp::getFlops() {
  auto type = getType();
  return 3 * type.getNumElements() / type.getDimSize(3) * 2 * getRotatedPairsAttr().getInt();
}

// Every query against every key (an upper bound for masked shapes): q.k and p.v, plus the softmax.
int64_t AttentionOp::getFlops() {
  auto query = getQuery().getType(), value = getValue().getType();
  int64_t rows = query.getDimSize(0) * query.getDimSize(1) * query.getDimSize(2);
  int64_t keys = getKey().getType().getDimSize(1);
  return rows * keys * (2 * query.getDimSize(3) + 2 * value.getDimSize(3) + 5);
}

// Recomputing the probabilities plus the four products of the gradients: about twice the forward.
int64_t AttentionBackwardOp::getFlops() {
  auto query = getQuery().getType(), value = getValue().getType();
  int64_t rows = query.getDimSize(0) * query.getDimSize(1) * query.getDimSize(2);
  int64_t keys = getKey().getType().getDimSize(1);
  return rows * keys * (4 * query.getDimSize(3) + 4 * value.getDimSize(3) + 8);
}

int64_t MoeRouteOp::getFlops() { return 5 * getLogits().getType().getNumElements(); }

// Per routed (token, expert) pair: gate and up projections (2 * 2IH), down (2IH), the gated GELU.
int64_t MoeExpertsOp::getFlops() {
  auto weights = getWeights().getType();
  int64_t pairs = weights.getDimSize(0) * weights.getDimSize(1);
  int64_t hidden = getInput().getType().getDimSize(1), inner = getDown().getType().getDimSize(2);
  int64_t adapters = 0;  // the two low-rank products per pair present, and the scaled add
  if (auto a = getLoraGateUpA()) adapters += 2 * a.getType().getDimSize(1) * (hidden + 2 * inner) + 4 * inner;
  if (auto a = getLoraDownA()) adapters += 2 * a.getType().getDimSize(1) * (inner + hidden) + 2 * hidden;
  return pairs * (6 * hidden * inner + 9 * inner + 2 * hidden + adapters);
}

int64_t MoeRouteBackwardOp::getFlops() { return 8 * getLogits().getType().getNumElements(); }

// Per routed pair, the products of the gradients: down's (2IH), the down product of dy (2IH),
// gate_up's (4IH) and the input's (4IH); without the forward's pre-activations, the gate and up
// projections again (4IH). Then the gated GELU's derivative and the weight's dot product.
int64_t MoeExpertsBackwardOp::getFlops() {
  auto weights = getWeights().getType();
  int64_t pairs = weights.getDimSize(0) * weights.getDimSize(1);
  int64_t hidden = getInput().getType().getDimSize(1), inner = getDown().getType().getDimSize(2);
  // Each base weight gradient left out (a frozen base) saves its product.
  int64_t products = getGateUpRows() ? 12 : 16;
  if (!getGradGateUp()) products -= 4;
  if (!getGradDown()) products -= 2;
  // Per pair present: the forward's low-rank products again (T), then dB, dT and dA, and dT's
  // addition to the input's gradient: five products of rank r.
  int64_t adapters = 0;
  if (auto a = getLoraGateUpA()) adapters += 2 * a.getType().getDimSize(1) * (3 * hidden + 4 * inner);
  if (auto a = getLoraDownA()) adapters += 2 * a.getType().getDimSize(1) * (3 * inner + 2 * hidden);
  return pairs * (products * hidden * inner + 16 * inner + 4 * hidden + adapters);
}

// Communication bytes (CommunicationOpInterface): what one rank receives, with the ring algorithms
// (docs/kernels.md, "Collective steps"). G is the axis size; a group of one moves nothing.
namespace {
int64_t bytesOf(Value value) { return storageBytes(cast<RankedTensorType>(value.getType())); }
int64_t groupOf(Operation* op) { return collectiveGroupSize(op).value_or(1); }
}  // namespace

// A ring reduce-scatter then a ring all-gather: each passes (G - 1) of the G blocks.
int64_t AllReduceOp::getCommunicationBytes() {
  int64_t group = groupOf(*this);
  return 2 * (group - 1) * bytesOf(getInput()) / group;
}
// The other G - 1 ranks' blocks.
int64_t AllGatherOp::getCommunicationBytes() { return (groupOf(*this) - 1) * bytesOf(getInput()); }
// G - 1 partial blocks of this rank's result, one from each other rank.
int64_t ReduceScatterOp::getCommunicationBytes() { return (groupOf(*this) - 1) * bytesOf(getResult()); }
// Every rank but the root receives the whole tensor (the root's count, 0, is not the maximum).
int64_t BroadcastOp::getCommunicationBytes() { return groupOf(*this) > 1 ? bytesOf(getInput()) : 0; }
// The root receives a partial tensor from each other rank.
int64_t ReduceToRootOp::getCommunicationBytes() { return (groupOf(*this) - 1) * bytesOf(getInput()); }
// The worst case: the whole capacity from other peers, plus one count from each.
int64_t AllToAllOp::getCommunicationBytes() {
  int64_t group = groupOf(*this);
  return group > 1 ? bytesOf(getResult()) + (group - 1) * 8 : 0;
}

// Expert-parallel dispatch: routing and permutations move data; the combine is a multiply-add per
// element and route. The local experts count every row of their capacity, an upper bound (the
// received rows are known only at run time), with dg.moe_experts' per-route cost.
int64_t MoeDispatchOp::getFlops() { return 0; }
int64_t MoePermuteOp::getFlops() { return 0; }
int64_t MoeCombineOp::getFlops() { return 2 * elementsOf(getRows()); }

int64_t MoeLocalExpertsOp::getFlops() {
  int64_t rows = getRows().getType().getDimSize(0), hidden = getRows().getType().getDimSize(1);
  int64_t inner = getDown().getType().getDimSize(2);
  return rows * (6 * hidden * inner + 9 * inner + 2 * hidden);
}

int64_t MoeLocalExpertsBackwardOp::getFlops() {
  int64_t rows = getRows().getType().getDimSize(0), hidden = getRows().getType().getDimSize(1);
  int64_t inner = getDown().getType().getDimSize(2);
  return rows * (14 * hidden * inner + 16 * inner + 4 * hidden);
}
