#include "compiler/Transforms/ShardingConsistency.h"

#include "compiler/Transforms/ShardingProjection.h"
#include "dialects/dg/IR/DgDialect.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::dg {

ShardingRuleAttr effectiveShardingRule(Operation* op) {
  auto ruled = dyn_cast<ShardingRuleOpInterface>(op);
  if (!ruled) return {};
  ShardingRuleAttr rule = ruled.getShardingRule();
  std::optional<int64_t> rowFactor;
  FactorKind rowKind = FactorKind::PassThrough;
  if (isa<GatherOp>(op)) rowFactor = rule.getOperands()[0].getDimFactors(0).front(), rowKind = FactorKind::Reduction;
  if (isa<ScatterAddOp>(op)) rowFactor = rule.getResults()[0].getDimFactors(0).front();
  if (!rowFactor) return rule;
  SmallVector<FactorKind> kinds(rule.getFactorKinds());
  kinds[*rowFactor] = rowKind;
  return ShardingRuleAttr::get(op->getContext(), rule.getFactorSizes(), kinds, rule.getOperands(), rule.getResults());
}

LinearOperands linearOperandsOf(Operation* op) {
  if (isa<AddOp, SubOp, ConcatOp>(op)) return LinearOperands::AllAlike;
  if (isa<MulOp, MatmulOp>(op)) return LinearOperands::AtMostOne;
  if (isa<DivOp, NegOp, ReshapeOp, TransposeOp, SliceOp, ReduceSumOp>(op)) return LinearOperands::First;
  if (auto cast = dyn_cast<CastOp>(op)) {
    auto from = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getInput().getType()));
    auto to = dyn_cast<FloatType>(getElementTypeOrSelf(cast.getType()));
    if (from && to && to.getWidth() >= from.getWidth()) return LinearOperands::First;
  }
  return LinearOperands::None;
}

int64_t axesSize(const Mesh& mesh, ArrayRef<StringRef> axes) {
  int64_t size = 1;
  for (StringRef axis : axes) size *= mesh.axisSize(axis).value_or(1);
  return size;
}

SmallVector<StringRef> inMeshOrder(const Mesh& mesh, ArrayRef<StringRef> axes) {
  SmallVector<StringRef> ordered;
  for (const Mesh::Axis& axis : mesh.axes())
    if (llvm::is_contained(axes, StringRef(axis.name))) ordered.push_back(axis.name);
  // Axes the mesh does not know keep their order after the known ones (the verifier reports them).
  for (StringRef axis : axes)
    if (!llvm::is_contained(ordered, axis)) ordered.push_back(axis);
  return ordered;
}

ShardingAttr resultShardingOf(Value value) {
  Operation* producer = value.getDefiningOp();
  if (!producer) return {};
  auto shardings = producer->getAttrOfType<ArrayAttr>(kShardingsAttr);
  if (!shardings) return {};
  return dyn_cast<ShardingAttr>(shardings[cast<OpResult>(value).getResultNumber()]);
}

ShardingAttr operandShardingOf(Operation* op, unsigned index) {
  auto shardings = op->getAttrOfType<ArrayAttr>(kOperandShardingsAttr);
  if (!shardings || index >= shardings.size()) return {};
  return dyn_cast<ShardingAttr>(shardings[index]);
}

namespace {

std::string axisList(ArrayRef<StringRef> axes) {
  std::string text = "[";
  llvm::raw_string_ostream os(text);
  llvm::interleaveComma(axes, os);
  os << "]";
  return text;
}

bool sameAxisSet(ArrayRef<StringRef> a, ArrayRef<StringRef> b) {
  return a.size() == b.size() && llvm::all_of(a, [&](StringRef axis) { return llvm::is_contained(b, axis); });
}

// One op against its (effective) sharding rule.
class RuleCheck {
 public:
  RuleCheck(Operation* op, ShardingRuleAttr rule, const Mesh& mesh) : op_(op), rule_(rule), mesh_(mesh) {}

  LogicalResult run() {
    for (unsigned i = 0; i < op_->getNumOperands(); ++i)
      if (failed(record(operandShardingOf(op_, i), rule_.getOperands()[i], "operand " + std::to_string(i))))
        return failure();
    for (unsigned j = 0; j < op_->getNumResults(); ++j)
      if (failed(record(resultShardingOf(op_->getResult(j)), rule_.getResults()[j], "result " + std::to_string(j))))
        return failure();
    FailureOr<SmallVector<StringRef>> linear = linearPartial();
    if (failed(linear)) return failure();
    for (unsigned j = 0; j < op_->getNumResults(); ++j) {
      SmallVector<StringRef> expected(*linear);
      for (int64_t factor = 0; factor < rule_.getNumFactors(); ++factor)
        if (rule_.getFactorKinds()[factor] == FactorKind::Reduction && !appearsIn(rule_.getResults()[j], factor))
          llvm::append_range(expected, assigned_.lookup(factor));
      SmallVector<StringRef> actual = resultShardingOf(op_->getResult(j)).getPartialAxes();
      if (!sameAxisSet(expected, actual))
        return op_->emitOpError() << "result " << j << " must be partial over " << axisList(inMeshOrder(mesh_, expected))
                                  << " (its missing reduction factors and its linear operands' pending sums), but is "
                                  << "partial over " << axisList(actual);
    }
    return success();
  }

 private:
  static bool appearsIn(TensorFactorsAttr tensor, int64_t factor) {
    for (int64_t d = 0; d < tensor.getRank(); ++d)
      if (llvm::is_contained(tensor.getDimFactors(d), factor)) return true;
    return false;
  }

  // Records how `sharding` splits each factor of `tensor`, checking it against what earlier tensors
  // said about the same factor.
  LogicalResult record(ShardingAttr sharding, TensorFactorsAttr tensor, const std::string& what) {
    for (int64_t d = 0; d < tensor.getRank(); ++d) {
      SmallVector<StringRef> axes = sharding.getDimAxes(d);
      auto split = splitDimOverFactors(mesh_, rule_, tensor.getDimFactors(d), axes);
      if (!split)
        return op_->emitOpError() << what << " dim " << d << ": axes " << axisList(axes)
                                  << " do not split the dimension's factors major to minor";
      for (auto [factor, factorAxes] : llvm::zip(tensor.getDimFactors(d), *split)) {
        if (rule_.getFactorKinds()[factor] == FactorKind::NeedReplication && !factorAxes.empty())
          return op_->emitOpError() << what << " dim " << d << " splits a factor that must stay whole over "
                                    << axisList(factorAxes);
        auto [it, inserted] = assigned_.try_emplace(factor, factorAxes);
        if (inserted) {
          firstSeen_[factor] = what + " dim " + std::to_string(d);
        } else if (it->second != factorAxes) {
          return op_->emitOpError() << what << " dim " << d << " splits its factor over " << axisList(factorAxes)
                                    << " but " << firstSeen_[factor] << " splits it over " << axisList(it->second);
        }
      }
    }
    return success();
  }

  // The pending sums the linear operands pass to every result.
  FailureOr<SmallVector<StringRef>> linearPartial() {
    LinearOperands linear = linearOperandsOf(op_);
    SmallVector<StringRef> passed;
    int partialOperands = 0;
    for (unsigned i = 0; i < op_->getNumOperands(); ++i) {
      SmallVector<StringRef> partial = operandShardingOf(op_, i).getPartialAxes();
      bool allowed = linear == LinearOperands::AllAlike || linear == LinearOperands::AtMostOne ||
                     (linear == LinearOperands::First && i == 0);
      if (partial.empty() && linear != LinearOperands::AllAlike) continue;
      if (!allowed)
        return op_->emitOpError() << "operand " << i << " is partial over " << axisList(partial)
                                  << ", but the op is not linear in it";
      if (linear == LinearOperands::AllAlike && i > 0 && !sameAxisSet(partial, passed))
        return op_->emitOpError() << "operand " << i << " is partial over " << axisList(partial) << " but operand 0 over "
                                  << axisList(passed) << " (a sum's operands must be partial alike)";
      if (linear == LinearOperands::AtMostOne && ++partialOperands > 1)
        return op_->emitOpError() << "operand " << i << " is partial over " << axisList(partial)
                                  << ", but only one operand of a product may be partial";
      passed = partial;
    }
    return passed;
  }

  Operation* op_;
  ShardingRuleAttr rule_;
  const Mesh& mesh_;
  DenseMap<int64_t, SmallVector<StringRef>> assigned_;
  DenseMap<int64_t, std::string> firstSeen_;
};

LogicalResult checkOp(Operation* op, const Mesh& mesh, llvm::StringMap<ShardingAttr>& parameterShardings) {
  if (op->getNumResults() && !op->getAttrOfType<ArrayAttr>(kShardingsAttr))
    return op->emitOpError() << "has no '" << kShardingsAttr << "'";
  if (op->getNumOperands() && !op->getAttrOfType<ArrayAttr>(kOperandShardingsAttr))
    return op->emitOpError() << "has no '" << kOperandShardingsAttr << "'";
  if (auto param = dyn_cast<ParamOp>(op)) {
    ShardingAttr sharding = resultShardingOf(param);
    auto [it, inserted] = parameterShardings.try_emplace(param.getName(), sharding);
    if (!inserted && it->second != sharding)
      return op->emitOpError() << "parameter '" << param.getName() << "' is sharded " << sharding << " here but "
                               << it->second << " elsewhere in the module";
    return success();
  }
  if (auto assign = dyn_cast<AssignOp>(op)) {
    ShardingAttr target = resultShardingOf(assign.getTarget());
    for (unsigned i = 0; i < 2; ++i)
      if (operandShardingOf(op, i) != target)
        return op->emitOpError() << "operand " << i << " must be consumed as the target parameter's sharding " << target;
    return success();
  }
  if (isa<OutputOp>(op)) {
    if (!operandShardingOf(op, 0).getPartialAxes().empty())
      return op->emitOpError() << "an output must not be partial (a pending sum is resolved before it)";
    return success();
  }
  ShardingRuleAttr rule = effectiveShardingRule(op);
  if (!rule) return op->emitOpError() << "has no sharding rule";
  return RuleCheck(op, rule, mesh).run();
}

}  // namespace

LogicalResult verifyShardingConsistency(ModuleOp module) {
  Mesh mesh = Mesh::of(module);
  llvm::StringMap<ShardingAttr> parameterShardings;
  for (auto function : module.getOps<func::FuncOp>()) {
    WalkResult result = function.walk([&](Operation* op) {
      if (op == function.getOperation() || isa<func::ReturnOp>(op)) return WalkResult::advance();
      return failed(checkOp(op, mesh, parameterShardings)) ? WalkResult::interrupt() : WalkResult::advance();
    });
    if (result.wasInterrupted()) return failure();
  }
  return success();
}

}  // namespace mlir::dg
