// dg-shard-propagate: gives every op the shardings of its results (dg.shardings) and the shardings
// in which it consumes its operands (dg.operand_shardings), in one pass in program order over each
// entry point, from the sources dg-shard-annotate fixed (docs/parallelism.md, "Annotation and
// propagation"). Per op, through its sharding rule:
//  1. each operand is offered as its producer left it, except that a pending sum the op is not
//     linear in is resolved first (resolvedOffer says into which split, finding the data and tensor
//     axes by their roles);
//  2. factors take the splits of the offered operands, weights first, then the most split operands:
//     where two operands disagree on a factor or an axis, the first one wins and the others are
//     resharded by the partitioner (this is what turns a column GEMM's sequence-split input into an
//     all-gather, and a token-split input of the experts into the all-gather form);
//  3. a split that some dimension cannot express (a minor factor under an incompletely split major
//     one) is dropped;
//  4. results get the factors' splits, partial over the axes of the reduction factors they lack and
//     over the pending sums of the linear operands.
#include "compiler/Transforms/Passes.h"
#include "compiler/Transforms/ShardingConsistency.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
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
      if (sp_ && shape.size() == 3) onto(1, tensorAxes_);
      if (microBatch_ > 0 && !shape.empty() && shape[0] % microBatch_ == 0) onto(0, dataAxes_);
    }
    return make(dims, {});
  }

  LogicalResult propagateThroughRule(Operation* op, ShardingRuleAttr rule, SmallVector<ShardingAttr>& offered) {
    unsigned numOperands = op->getNumOperands();
    // 1. Which operands keep their pending sums.
    LinearOperands linear = linearOperandsOf(op);
    SmallVector<bool> keepsPartial(numOperands, false);
    auto isPartial = [&](unsigned i) { return !offered[i].getPartialAxes().empty(); };
    int partialCount = llvm::count_if(llvm::seq(0u, numOperands), isPartial);
    for (unsigned i = 0; i < numOperands; ++i) {
      if (linear == LinearOperands::AllAlike) keepsPartial[i] = partialCount > 0;
      if (linear == LinearOperands::AtMostOne) keepsPartial[i] = partialCount == 1 && isPartial(i);
      if (linear == LinearOperands::First) keepsPartial[i] = i == 0 && isPartial(i);
    }
    Axes passedPartial;
    for (unsigned i = 0; i < numOperands; ++i) {
      if (keepsPartial[i]) {
        for (StringRef axis : offered[i].getPartialAxes())
          if (!llvm::is_contained(passedPartial, axis)) passedPartial.push_back(axis);
      } else {
        offered[i] = resolvedOffer(op->getOperand(i), offered[i]);
      }
    }

    // 2. Factor splits from the offered operands: weights first, then the most split.
    SmallVector<unsigned> order = llvm::to_vector(llvm::seq(0u, numOperands));
    auto splitCount = [&](unsigned i) {
      size_t count = 0;
      for (int64_t d = 0; d < offered[i].getRank(); ++d) count += offered[i].getDimAxes(d).size();
      return count;
    };
    llvm::stable_sort(order, [&](unsigned a, unsigned b) {
      bool weightA = isWeight(op->getOperand(a)), weightB = isWeight(op->getOperand(b));
      if (weightA != weightB) return weightA;
      return splitCount(a) > splitCount(b);
    });
    DenseMap<int64_t, Axes> assigned;
    llvm::StringSet<> used;
    for (unsigned i : order) {
      TensorFactorsAttr tensor = rule.getOperands()[i];
      for (int64_t d = 0; d < tensor.getRank(); ++d) {
        Axes axes = offered[i].getDimAxes(d);
        if (axes.empty()) continue;
        auto split = splitDimOverFactors(mesh_, rule, tensor.getDimFactors(d), axes);
        if (!split) continue;
        for (auto [factor, factorAxes] : llvm::zip(tensor.getDimFactors(d), *split)) {
          if (factorAxes.empty() || rule.getFactorKinds()[factor] == FactorKind::NeedReplication) break;
          auto existing = assigned.find(factor);
          if (existing != assigned.end()) {
            if (existing->second != factorAxes) break;
            continue;
          }
          // An axis another operand took ends the split: the factor keeps the major axes before it
          // (tokens split over {dp, ep} meeting experts split over ep stay split over dp, so the
          // experts gather over ep only).
          auto taken = llvm::find_if(factorAxes, [&](StringRef axis) { return used.contains(axis); });
          if (taken == factorAxes.begin()) break;
          assigned[factor] = Axes(factorAxes.begin(), taken);
          for (StringRef axis : assigned[factor]) used.insert(axis);
          if (taken != factorAxes.end()) break;
        }
      }
    }

    // 3. Drop splits of minor factors whose major factor is not split completely, in any tensor.
    SmallVector<TensorFactorsAttr> tensors(rule.getOperands());
    llvm::append_range(tensors, rule.getResults());
    for (bool changed = true; changed;) {
      changed = false;
      for (TensorFactorsAttr tensor : tensors)
        for (int64_t d = 0; d < tensor.getRank(); ++d) {
          bool majorComplete = true;
          for (int64_t factor : tensor.getDimFactors(d)) {
            auto it = assigned.find(factor);
            if (it == assigned.end()) {
              majorComplete = false;
              continue;
            }
            if (!majorComplete) {
              for (StringRef axis : it->second) used.erase(axis);
              assigned.erase(it);
              changed = true;
              continue;
            }
            majorComplete = axesSize(mesh_, it->second) == rule.getFactorSizes()[factor];
          }
        }
    }

    // 4. The shardings.
    auto shardingOf = [&](TensorFactorsAttr tensor, Axes partial) {
      SmallVector<Axes> dims;
      for (int64_t d = 0; d < tensor.getRank(); ++d) {
        Axes axes;
        for (int64_t factor : tensor.getDimFactors(d)) {
          auto it = assigned.find(factor);
          if (it == assigned.end()) break;
          llvm::append_range(axes, it->second);
        }
        dims.push_back(axes);
      }
      return make(dims, partial);
    };
    Axes passed;
    for (StringRef axis : passedPartial)
      if (!used.contains(axis)) passed.push_back(axis);
    SmallVector<ShardingAttr> operandShardings, resultShardings;
    for (unsigned i = 0; i < numOperands; ++i)
      operandShardings.push_back(shardingOf(rule.getOperands()[i], keepsPartial[i] ? passed : Axes()));
    for (TensorFactorsAttr tensor : rule.getResults()) {
      Axes partial(passed);
      for (int64_t factor = 0; factor < rule.getNumFactors(); ++factor) {
        if (rule.getFactorKinds()[factor] != FactorKind::Reduction || !assigned.count(factor)) continue;
        bool present = false;
        for (int64_t d = 0; d < tensor.getRank(); ++d) present |= llvm::is_contained(tensor.getDimFactors(d), factor);
        if (!present) llvm::append_range(partial, assigned[factor]);
      }
      resultShardings.push_back(shardingOf(tensor, partial));
    }
    if (numOperands) op->setAttr(kOperandShardingsAttr, shardingList(op->getContext(), operandShardings));
    op->setAttr(kShardingsAttr, shardingList(op->getContext(), resultShardings));
    return success();
  }

  ModuleOp module_;
  Mesh mesh_;
  bool sp_;
  Axes tensorAxes_, dataAxes_;
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
