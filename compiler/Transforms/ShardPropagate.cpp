// dg-shard-propagate: gives every op the shardings of its results (dg.shardings) and the shardings
// in which it consumes its operands (dg.operand_shardings), in one pass in program order over each
// entry point, from the sources dg-shard-annotate fixed (docs/parallelism.md, "Annotation and
// propagation"). Per op, through its sharding rule:
//  1. each operand is offered as its producer left it, except that a pending sum the op is not
//     linear in is resolved first (resolvedOffer, here, says into which split: it depends on what
//     the value is and on the mesh axes' roles);
//  2. factors take the splits of the offered operands, weights first, then the most split operands:
//     where two operands disagree on a factor or an axis, the first one wins and the others are
//     resharded by the partitioner (this is what turns a column GEMM's sequence-split input into an
//     all-gather, and a token-split input of the experts into the all-gather form);
//  3. a split that some dimension cannot express (a minor factor under an incompletely split major
//     one) is dropped;
//  4. results get the factors' splits, partial over the axes of the reduction factors they lack and
//     over the pending sums of the linear operands.
// Steps 2 to 4 are PropagationStrategy.h's policy over ShardingProjection.h's projections.
#include "compiler/Transforms/Passes.h"
#include "compiler/Transforms/PropagationStrategy.h"
#include "compiler/Transforms/ShardingConsistency.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringMap.h"
#include "plan/Names.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGSHARDPROPAGATE
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

using Axes = SmallVector<StringRef>;

ArrayAttr shardingList(MLIRContext* context, ArrayRef<ShardingAttr> shardings) {
  return ArrayAttr::get(context, SmallVector<Attribute>(shardings.begin(), shardings.end()));
}

// A weight as the ops see it: a parameter, possibly cast to the compute precision.
bool isWeight(Value value) {
  Operation* producer = value.getDefiningOp();
  if (isa_and_nonnull<ParamOp>(producer)) return true;
  if (auto cast = dyn_cast_or_null<CastOp>(producer)) return isWeight(cast.getInput());
  return false;
}

class Propagator {
 public:
  // The dense data-parallel group is the data axes and the expert axes carved from them
  // (docs/parallelism.md, "Meshes").
  Propagator(ModuleOp module, bool sequenceParallel)
      : module_(module),
        mesh_(Mesh::of(module)),
        sp_(sequenceParallel),
        tensorAxes_(mesh_.axesWithRole(AxisRole::Tensor)),
        contextAxes_(mesh_.axesWithRole(AxisRole::Context)),
        dataAxes_(mesh_.axesWithAnyRole({AxisRole::Data, AxisRole::Expert})) {
    // Each gradient buffer resolves into the layout of its Adam moments: under ZeRO-1 their shard,
    // so that the clip's squares and AdamW read one reduce-scattered gradient.
    module.walk([&](ParamOp param) {
      StringRef name = param.getName();
      std::string prefix = std::string(dgemma::kOptimizerStatePrefix) + "exp_avg/";
      if (name.starts_with(prefix))
        if (ShardingAttr sharding = resultShardingOf(param))
          momentShardings_[name.drop_front(prefix.size())] = sharding;
    });
  }

  LogicalResult run() {
    for (auto function : module_.getOps<func::FuncOp>()) {
      microBatch_ = 0;
      if (auto bucket = function->getAttrOfType<DictionaryAttr>(kBucketAttr))
        if (auto micro = bucket.getAs<IntegerAttr>("micro_batch")) microBatch_ = micro.getInt();
      for (Operation& op : function.getBody().getOps())
        if (failed(visit(&op))) return failure();
    }
    return success();
  }

 private:
  ShardingAttr make(ArrayRef<Axes> dims, ArrayRef<StringRef> partial) {
    return ShardingAttr::get(module_.getContext(), dims, inMeshOrder(mesh_, partial));
  }
  static SmallVector<Axes> dimsOf(ShardingAttr sharding) {
    SmallVector<Axes> dims;
    for (int64_t d = 0; d < sharding.getRank(); ++d) dims.push_back(sharding.getDimAxes(d));
    return dims;
  }

  LogicalResult visit(Operation* op) {
    if (isa<func::ReturnOp>(op)) return success();
    if (isa<ParamOp, InputOp>(op)) {
      if (!op->getAttrOfType<ArrayAttr>(kShardingsAttr))
        return op->emitOpError() << "has no sharding: dg-shard-annotate must run before dg-shard-propagate";
      return success();
    }
    SmallVector<ShardingAttr> offered;
    for (Value operand : op->getOperands()) {
      ShardingAttr sharding = resultShardingOf(operand);
      if (!sharding) return op->emitOpError() << "consumes a value without a sharding";
      offered.push_back(sharding);
    }
    if (auto assign = dyn_cast<AssignOp>(op)) {
      ShardingAttr target = offered[0];
      op->setAttr(kOperandShardingsAttr, shardingList(op->getContext(), {target, target}));
      return success();
    }
    if (isa<OutputOp>(op)) {
      op->setAttr(kOperandShardingsAttr, shardingList(op->getContext(), {make(dimsOf(offered[0]), {})}));
      return success();
    }
    ShardingRuleAttr rule = effectiveShardingRule(op);
    if (!rule) return op->emitOpError() << "has no sharding rule, so dg-shard-propagate cannot shard it";
    return propagateThroughRule(op, rule, offered);
  }

  // Where a pending sum goes when an op that is not linear in it consumes it: a gradient buffer into
  // its moments' layout (reduce-scatter under ZeRO-1, else all-reduce); with sequence parallelism a
  // [batch, sequence, hidden] activation summed over the tensor group into a sequence split
  // (reduce-scatter, Megatron's SP); an activation summed over data axes (the experts' result in the
  // all-gather form) back into its batch split. Anything else becomes whole (all-reduce).
  ShardingAttr resolvedOffer(Value value, ShardingAttr sharding) {
    Axes partial = sharding.getPartialAxes();
    SmallVector<Axes> dims = dimsOf(sharding);
    if (partial.empty()) return sharding;
    if (auto param = dyn_cast_or_null<ParamOp>(value.getDefiningOp())) {
      StringRef name = param.getName();
      if (name.consume_front(dgemma::kGradientPrefix))
        if (ShardingAttr moments = momentShardings_.lookup(name)) return make(dimsOf(moments), {});
      return make(dims, {});
    }
    auto shape = cast<RankedTensorType>(value.getType()).getShape();
    auto onto = [&](int64_t dim, ArrayRef<StringRef> group) {
      Axes axes;
      for (StringRef axis : group)
        if (llvm::is_contained(partial, axis)) axes.push_back(axis);
      // Onto the minor end of the dim's split: an activation split over dp and summed over ep (the
      // experts' result when EP < DP) becomes split over {dp, ep}.
      if (axes.empty() || llvm::any_of(axes, [&](StringRef axis) { return llvm::is_contained(dims[dim], axis); }))
        return;
      Axes split = dims[dim];
      llvm::append_range(split, axes);
      if (shape[dim] % axesSize(mesh_, split) != 0) return;
      dims[dim] = split;
    };
    if (!isWeight(value)) {
      // A sum over the context group of a sequence-major activation (the key and value gradients of
      // the queries a rank holds) becomes that rank's sequence block: the reduce-scatter that is the
      // backward of the K/V all-gather.
      if (shape.size() >= 3) onto(1, contextAxes_);
      if (sp_ && shape.size() == 3) onto(1, tensorAxes_);
      if (microBatch_ > 0 && !shape.empty() && shape[0] % microBatch_ == 0) onto(0, dataAxes_);
    }
    return make(dims, {});
  }

  // An encoder pass's input hidden states (marked by the model) are offered with their sequence
  // split over the context axes, the major part of dim 1: the rank's block is a local slice, and the
  // split flows from there through the encoder (docs/parallelism.md, "Context parallelism").
  ShardingAttr contextSplitOffer(Value value, ShardingAttr sharding) {
    Operation* producer = value.getDefiningOp();
    if (contextAxes_.empty() || !producer || !producer->hasAttr(kContextSplitAttr)) return sharding;
    auto shape = cast<RankedTensorType>(value.getType()).getShape();
    SmallVector<Axes> dims = dimsOf(sharding);
    if (shape.size() != 3 ||
        llvm::any_of(contextAxes_, [&](StringRef axis) { return llvm::is_contained(dims[1], axis); }))
      return sharding;
    Axes split = contextAxes_;
    llvm::append_range(split, dims[1]);
    if (shape[1] % axesSize(mesh_, split) != 0) return sharding;
    dims[1] = split;
    return make(dims, sharding.getPartialAxes());
  }

  LogicalResult propagateThroughRule(Operation* op, ShardingRuleAttr rule, SmallVector<ShardingAttr>& offered) {
    SmallVector<bool> keepsPendingSum = operandsKeepingPendingSums(linearOperandsOf(op), offered);
    SmallVector<bool> weights;
    for (auto [index, operand] : llvm::enumerate(op->getOperands())) {
      if (!keepsPendingSum[index]) offered[index] = resolvedOffer(operand, offered[index]);
      offered[index] = contextSplitOffer(operand, offered[index]);
      weights.push_back(isWeight(operand));
    }
    OpShardings shardings = shardThroughRule(mesh_, rule, offered, keepsPendingSum, weights);
    if (op->getNumOperands()) op->setAttr(kOperandShardingsAttr, shardingList(op->getContext(), shardings.operands));
    op->setAttr(kShardingsAttr, shardingList(op->getContext(), shardings.results));
    return success();
  }

  ModuleOp module_;
  Mesh mesh_;
  bool sp_;
  Axes tensorAxes_, contextAxes_, dataAxes_;
  llvm::StringMap<ShardingAttr> momentShardings_;
  int64_t microBatch_ = 0;
};

struct DgShardPropagatePass : mlir::dg::impl::DgShardPropagateBase<DgShardPropagatePass> {
  using DgShardPropagateBase::DgShardPropagateBase;
  void runOnOperation() override {
    if (failed(Propagator(getOperation(), sequenceParallel).run())) signalPassFailure();
  }
};

}  // namespace
