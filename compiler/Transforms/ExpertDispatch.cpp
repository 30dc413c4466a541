// dg-expert-dispatch: expert parallelism's all-gather form, which moves every token to every rank
// of the expert axis, becomes the all-to-all form of docs/parallelism.md, "Expert parallelism",
// which sends each route only to the rank that holds its expert:
//
//   forward                                       backward (after autodiff)
//   slots, send, counts = moe_dispatch(idx)        the forward's slots, received rows and counts
//   xs = moe_permute(x, slots)                     dys = moe_permute(dy, slots)
//   recv_counts = all_to_all(counts, ones)         ws = moe_permute(w, slots)   (per route)
//   xr, recv = all_to_all(xs, send)                dyr, wr = all_to_all(dys, ws; send)
//   yr = moe_local_experts(xr, recv_counts)        dxr, dwr, dG, dD = moe_local_experts_backward(...)
//   ys = all_to_all(yr, recv)                      dxs, dws = all_to_all(dxr, dwr; recv)
//   y = moe_combine(ys, slots, w)                  dx = moe_combine(dxs, slots); dw = dws unpermuted
//
// Global expert e lives on rank e / E_local of the axis, so the dispatch's grouping by global expert
// is the grouping by destination rank, then local expert, that the exchange and the grouped GEMMs
// need. Every op here is exact: each route's expert output is the one the all-gather form computes,
// and the combine sums a token's routes in order of j.
#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/SetVector.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGEXPERTDISPATCH
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

// The attribute the partitioner puts on the all-gather form's expert ops (docs/parallelism.md).
constexpr StringLiteral kExpertOffsetAttr = "expert_offset";

RankedTensorType typeOf(Value value) { return cast<RankedTensorType>(value.getType()); }

RankedTensorType withShape(Value value, ArrayRef<int64_t> shape) {
  return RankedTensorType::get(shape, typeOf(value).getElementType());
}

// The expert axis and this rank's place on it, read from one all-gather-form expert op.
struct ExpertAxis {
  StringAttr axis;
  int64_t size = 0;         // G
  int64_t coordinate = 0;   // this rank's position on the axis: expert_offset / E_local
  int64_t localExperts = 0; // E_local
  int64_t tokens = 0;       // N, this rank's rows
};

// The rank's own rows of a gathered value: the input of an all_gather over the axis (added to
// `bypassed`), or block `coordinate` of dim 0 of a value every rank holds whole.
Value localRowsOf(OpBuilder& builder, Location loc, Value gathered, const ExpertAxis& expert,
                llvm::SetVector<Operation*>& bypassed) {
  if (auto gather = gathered.getDefiningOp<AllGatherOp>(); gather && gather.getAxisAttr() == expert.axis) {
    bypassed.insert(gather);
    return gather.getInput();
  }
  SmallVector<int64_t> shape(typeOf(gathered).getShape());
  shape[0] = expert.tokens;
  return builder.create<SliceOp>(loc, withShape(gathered, shape), gathered, 0, expert.coordinate * expert.tokens);
}

// The sum reduce-scatter over the axis that `value` alone feeds, directly or through reshapes that
// have no other use (the model flattens [B, S, H] to the experts' [B·S, H] rows and the partitioner
// scatters the unflattened partial sum). A reduce-scatter keeps block r of dim 0, a contiguous block
// of the row-major elements, and a reshape keeps their order, so the scattered block is the rank's
// own rows of `value` whatever the reshapes. `reshapes` gets the reshapes in order.
struct RowScatter {
  ReduceScatterOp scatter;          // null when `value` is unused
  SmallVector<ReshapeOp> reshapes;  // value -> ... -> scatter
};

FailureOr<RowScatter> soleReduceScatter(Value value, StringAttr axis) {
  RowScatter found;
  if (value.use_empty()) return found;
  while (value.hasOneUse()) {
    Operation* user = *value.getUsers().begin();
    if (auto reshape = dyn_cast<ReshapeOp>(user)) {
      found.reshapes.push_back(reshape);
      value = reshape.getResult();
      continue;
    }
    auto scatter = dyn_cast<ReduceScatterOp>(user);
    if (!scatter || scatter.getAxisAttr() != axis || scatter.getReduce() != ReductionKind::Sum) return failure();
    found.scatter = scatter;
    return found;
  }
  return failure();
}

// What an expert op of the all-gather form reads: the axis, from the all_gather of its input.
FailureOr<ExpertAxis> matchExpertAxis(Operation* op, Value gatheredInput, Value gateUp) {
  auto offset = op->getAttrOfType<IntegerAttr>(kExpertOffsetAttr);
  auto gather = gatheredInput.getDefiningOp<AllGatherOp>();
  if (!offset || !gather) return failure();
  std::optional<int64_t> size = collectiveGroupSize(gather);
  if (!size) return failure();
  ExpertAxis expert;
  expert.axis = gather.getAxisAttr();
  expert.size = *size;
  expert.localExperts = typeOf(gateUp).getDimSize(0);
  expert.tokens = typeOf(gather.getInput()).getDimSize(0);
  if (expert.localExperts == 0 || offset.getInt() % expert.localExperts != 0) return failure();
  expert.coordinate = offset.getInt() / expert.localExperts;
  if (expert.coordinate < 0 || expert.coordinate >= expert.size) return failure();
  return expert;
}

// The forward half of the exchange, which the backward of the same tokens reuses.
struct Dispatched {
  Value slots, sendCounts, receivedRows, receivedCounts, receivedExpertCounts;
};

class ExpertDispatchRewriter {
 public:
  explicit ExpertDispatchRewriter(OpBuilder& builder) : b_(builder) {}

  // Ops with per-expert adapters keep the all-gather form: dg.moe_local_experts has no adapter
  // operands (docs/parallelism.md, "Expert parallelism").
  static bool hasAdapters(Operation* op) { return op->hasAttr("lora_scale"); }

  void rewrite(MoeExpertsOp op) {
    if (hasAdapters(op)) return;
    FailureOr<ExpertAxis> expert = matchExpertAxis(op, op.getInput(), op.getGateUp());
    if (failed(expert)) return;
    FailureOr<RowScatter> scatter = soleReduceScatter(op.getResult(), expert->axis);
    if (failed(scatter) || !scatter->scatter || !scattersLocalRows(scatter->scatter, op.getResult(), *expert)) return;
    Location loc = op.getLoc();
    b_.setInsertionPoint(op);
    Value x = localRows(loc, op.getInput(), *expert);
    Value weights = localRows(loc, op.getWeights(), *expert);
    Value indices = localRows(loc, op.getIndices(), *expert);
    const Dispatched sent = dispatch(loc, x, indices, *expert);

    Value outputs = b_.create<MoeLocalExpertsOp>(loc, sent.receivedRows.getType(), sent.receivedRows,
                                                 sent.receivedExpertCounts, op.getGateUp(), op.getDown());
    Value returned = exchange(loc, outputs, sent.receivedCounts, routesOf(indices), expert->axis);
    Value combined =
        b_.create<MoeCombineOp>(loc, withShape(op.getResult(), typeOf(x).getShape()), returned, sent.slots, weights);
    replaceScattered(loc, *scatter, combined);
    op.erase();
  }

  void rewrite(MoeExpertsBackwardOp op) {
    if (hasAdapters(op)) return;
    FailureOr<ExpertAxis> expert = matchExpertAxis(op, op.getInput(), op.getGateUp());
    if (failed(expert)) return;
    auto gradOutputGather = op.getGradOutput().getDefiningOp<AllGatherOp>();
    FailureOr<RowScatter> gradInput = soleReduceScatter(op.getGradInput(), expert->axis);
    FailureOr<RowScatter> gradWeights = soleReduceScatter(op.getGradWeights(), expert->axis);
    if (!gradOutputGather || gradOutputGather.getAxisAttr() != expert->axis || failed(gradInput) ||
        failed(gradWeights) || !scattersLocalRows(gradInput->scatter, op.getGradInput(), *expert) ||
        !scattersLocalRows(gradWeights->scatter, op.getGradWeights(), *expert))
      return;
    Location loc = op.getLoc();
    b_.setInsertionPoint(op);
    Value x = localRows(loc, op.getInput(), *expert);
    Value weights = localRows(loc, op.getWeights(), *expert);
    Value indices = localRows(loc, op.getIndices(), *expert);
    const Dispatched sent = dispatch(loc, x, indices, *expert);
    const int64_t routes = routesOf(indices), capacity = typeOf(sent.receivedRows).getDimSize(0);

    bypassed_.insert(gradOutputGather);
    Value gradRows = exchange(loc, permute(loc, gradOutputGather.getInput(), sent.slots), sent.sendCounts, capacity,
                              expert->axis);
    // The routing weights travel as one value per route, in the permuted rows' order.
    Value routeWeights = b_.create<ReshapeOp>(loc, withShape(weights, {routes}), weights);
    Value routeSlots = perRouteSlots(loc, sent.slots);
    Value weightRows = exchange(loc, permute(loc, routeWeights, routeSlots), sent.sendCounts, capacity, expert->axis);

    auto backward = b_.create<MoeLocalExpertsBackwardOp>(
        loc,
        TypeRange{sent.receivedRows.getType(), weightRows.getType(), gradientType(op.getGradGateUp(), op.getGateUp()),
                  gradientType(op.getGradDown(), op.getDown())},
        sent.receivedRows, weightRows, gradRows, sent.receivedExpertCounts, op.getGateUp(), op.getDown());
    if (gradInput->scatter) {
      Value returned = exchange(loc, backward.getGradRows(), sent.receivedCounts, routes, expert->axis);
      Value combined = b_.create<MoeCombineOp>(loc, withShape(op.getGradInput(), typeOf(x).getShape()), returned,
                                               sent.slots, Value());
      replaceScattered(loc, *gradInput, combined);
    }
    if (gradWeights->scatter) {
      Value returned = exchange(loc, backward.getGradWeights(), sent.receivedCounts, routes, expert->axis);
      Value unpermuted = b_.create<MoeCombineOp>(loc, returned.getType(), returned, routeSlots, Value());
      replaceScattered(loc, *gradWeights, unpermuted);
    }
    // A frozen base's gradients, which the op no longer has, are computed and left unused here.
    if (Value gradGateUp = op.getGradGateUp()) gradGateUp.replaceAllUsesWith(backward.getGradGateUp());
    if (Value gradDown = op.getGradDown()) gradDown.replaceAllUsesWith(backward.getGradDown());
    op.erase();
  }

 private:
  static Type gradientType(Value gradient, Value weight) { return (gradient ? gradient : weight).getType(); }
  static int64_t routesOf(Value indices) { return typeOf(indices).getNumElements(); }

  // Whether the scatter (if any) keeps exactly the rank's N rows of the gathered `value`: the
  // rewrite computes those rows only.
  static bool scattersLocalRows(ReduceScatterOp scatter, Value value, const ExpertAxis& expert) {
    if (!scatter) return true;
    const int64_t rows = typeOf(value).getDimSize(0);
    return rows == expert.size * expert.tokens &&
           typeOf(scatter.getResult()).getNumElements() * expert.size == typeOf(value).getNumElements();
  }

  // The scatter's users read `local` (the rank's rows, in row-major order) in the scatter's shape;
  // the scatter and the reshapes before it go.
  void replaceScattered(Location loc, RowScatter& found, Value local) {
    Value result = found.scatter.getResult();
    if (local.getType() != result.getType()) local = b_.create<ReshapeOp>(loc, result.getType(), local);
    result.replaceAllUsesWith(local);
    found.scatter->erase();
    for (ReshapeOp reshape : llvm::reverse(found.reshapes)) reshape->erase();
  }

  // Routing, the counts exchange and the rows' exchange of the rank's tokens `x`, built once per
  // (x, indices, axis): a backward after its forward reuses the rows the forward received.
  Dispatched dispatch(Location loc, Value x, Value indices, const ExpertAxis& expert) {
    auto key = std::make_tuple(x, indices, Attribute(expert.axis));
    auto found = dispatched_.find(key);
    if (found != dispatched_.end() && dominatesInsertionPoint(found->second.receivedRows)) return found->second;

    auto i64 = b_.getI64Type();
    const int64_t routes = routesOf(indices), peers = expert.size;
    auto routing = b_.create<MoeDispatchOp>(
        loc, TypeRange{indices.getType(), RankedTensorType::get({peers}, i64),
                       RankedTensorType::get({peers, expert.localExperts}, i64)},
        indices, b_.getI64IntegerAttr(peers * expert.localExperts));
    // Each peer gets one row of the [G, E_local] counts: the routes it will receive per local expert.
    auto ones = RankedTensorType::get({peers}, i64);
    Value oneRowEach = b_.create<ConstantOp>(loc, DenseElementsAttr::get(ones, int64_t{1}));
    auto expertCounts = b_.create<AllToAllOp>(loc, routing.getExpertCounts().getType(), ones, routing.getExpertCounts(),
                                              oneRowEach, expert.axis);
    // Dropless: in the worst case every route of the axis' G ranks lands here.
    auto rows = b_.create<AllToAllOp>(loc, withShape(x, {peers * routes, typeOf(x).getDimSize(1)}), ones,
                                      permute(loc, x, routing.getSlots()), routing.getSendCounts(), expert.axis);
    Dispatched sent{routing.getSlots(), routing.getSendCounts(), rows.getResult(), rows.getRecvCounts(),
                    expertCounts.getResult()};
    return dispatched_[key] = sent;
  }

  bool dominatesInsertionPoint(Value value) {
    Operation* definition = value.getDefiningOp();
    Block* block = b_.getInsertionBlock();
    return definition->getBlock() == block &&
           (b_.getInsertionPoint() == block->end() || definition->isBeforeInBlock(&*b_.getInsertionPoint()));
  }

  // Each row of `values` ([M, ...]) to its k slots: [M·k, ...].
  Value permute(Location loc, Value values, Value slots) {
    SmallVector<int64_t> shape(typeOf(values).getShape());
    shape[0] = typeOf(slots).getNumElements();
    return b_.create<MoePermuteOp>(loc, withShape(values, shape), values, slots);
  }

  // slots [N, k] as [N·k, 1]: one slot per route, so that per-route values permute with k = 1.
  Value perRouteSlots(Location loc, Value slots) {
    return b_.create<ReshapeOp>(loc, withShape(slots, {typeOf(slots).getNumElements(), 1}), slots);
  }

  // dg.all_to_all of `rows` with `counts` into `capacity` rows; the received counts are not needed.
  Value exchange(Location loc, Value rows, Value counts, int64_t capacity, StringAttr axis) {
    SmallVector<int64_t> shape(typeOf(rows).getShape());
    shape[0] = capacity;
    return b_.create<AllToAllOp>(loc, withShape(rows, shape), counts.getType(), rows, counts, axis).getResult();
  }

  // One cut per gathered value, so that a forward and its backward see the same local indices.
  Value localRows(Location loc, Value gathered, const ExpertAxis& expert) {
    Value& local = localRows_[{gathered, expert.axis}];
    if (!local) local = localRowsOf(b_, loc, gathered, expert, bypassed_);
    return local;
  }

 public:
  // Removes the all-gathers the rewrites bypassed and left without users (an all-gather is never
  // dead code otherwise: a collective stays even when unused).
  void eraseBypassedGathers() {
    for (Operation* gather : bypassed_)
      if (gather->use_empty()) gather->erase();
    bypassed_.clear();
  }

 private:
  OpBuilder& b_;
  llvm::DenseMap<std::tuple<Value, Value, Attribute>, Dispatched> dispatched_;
  llvm::SetVector<Operation*> bypassed_;
  llvm::DenseMap<std::pair<Value, Attribute>, Value> localRows_;
};

struct DgExpertDispatchPass : mlir::dg::impl::DgExpertDispatchBase<DgExpertDispatchPass> {
  void runOnOperation() override {
    OpBuilder builder(&getContext());
    ExpertDispatchRewriter rewriter(builder);
    // In program order, so that a backward finds the forward of its tokens already rewritten.
    SmallVector<Operation*> experts;
    getOperation().walk([&](Operation* op) {
      if (isa<MoeExpertsOp, MoeExpertsBackwardOp>(op)) experts.push_back(op);
    });
    for (Operation* op : experts) {
      if (auto forward = dyn_cast<MoeExpertsOp>(op)) rewriter.rewrite(forward);
      else rewriter.rewrite(cast<MoeExpertsBackwardOp>(op));
    }
    rewriter.eraseBypassedGathers();
  }
};

}  // namespace
