// The propagation policy of PropagationStrategy.h.
#include "compiler/Transforms/PropagationStrategy.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/Sequence.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::dg {

SmallVector<bool> operandsKeepingPendingSums(LinearOperands linear, ArrayRef<ShardingAttr> offered) {
  auto isPartial = [&](unsigned i) { return !offered[i].getPartialAxes().empty(); };
  unsigned count = offered.size();
  int partialCount = llvm::count_if(llvm::seq(0u, count), isPartial);
  SmallVector<bool> keeps(count, false);
  for (unsigned i = 0; i < count; ++i) {
    if (linear == LinearOperands::AllAlike) keeps[i] = partialCount > 0;
    if (linear == LinearOperands::AtMostOne) keeps[i] = partialCount == 1 && isPartial(i);
    if (linear == LinearOperands::First) keeps[i] = i == 0 && isPartial(i);
  }
  return keeps;
}

SmallVector<unsigned> offerPriority(ArrayRef<ShardingAttr> offered, ArrayRef<bool> isWeight) {
  SmallVector<unsigned> order = llvm::to_vector(llvm::seq(0u, static_cast<unsigned>(offered.size())));
  auto splitCount = [&](unsigned i) {
    size_t count = 0;
    for (int64_t d = 0; d < offered[i].getRank(); ++d) count += offered[i].getDimAxes(d).size();
    return count;
  };
  llvm::stable_sort(order, [&](unsigned a, unsigned b) {
    if (isWeight[a] != isWeight[b]) return isWeight[a];
    return splitCount(a) > splitCount(b);
  });
  return order;
}

FactorAxes pickFactorSplits(const Mesh& mesh, ShardingRuleAttr rule, ArrayRef<ShardingAttr> offered,
                            ArrayRef<unsigned> priority) {
  FactorAxes assigned(rule.getNumFactors());
  llvm::StringSet<> used;
  for (unsigned i : priority) {
    TensorFactorsAttr tensor = rule.getOperands()[i];
    for (int64_t d = 0; d < tensor.getRank(); ++d) {
      SmallVector<StringRef> axes = offered[i].getDimAxes(d);
      if (axes.empty()) continue;
      auto split = splitDimOverFactors(mesh, rule, tensor.getDimFactors(d), axes);
      if (!split) continue;
      for (auto [factor, factorAxes] : llvm::zip(tensor.getDimFactors(d), *split)) {
        if (factorAxes.empty() || rule.getFactorKinds()[factor] == FactorKind::NeedReplication) break;
        if (!assigned[factor].empty()) {
          if (assigned[factor] != factorAxes) break;
          continue;
        }
        auto taken = llvm::find_if(factorAxes, [&](StringRef axis) { return used.contains(axis); });
        if (taken == factorAxes.begin()) break;
        assigned[factor] = SmallVector<StringRef>(factorAxes.begin(), taken);
        for (StringRef axis : assigned[factor]) used.insert(axis);
        if (taken != factorAxes.end()) break;
      }
    }
  }
  return assigned;
}

OpShardings shardThroughRule(const Mesh& mesh, ShardingRuleAttr rule, ArrayRef<ShardingAttr> offered,
                             ArrayRef<bool> keepsPendingSum, ArrayRef<bool> isWeight) {
  SmallVector<StringRef> keptSums;
  for (auto [sharding, keeps] : llvm::zip(offered, keepsPendingSum))
    if (keeps)
      for (StringRef axis : sharding.getPartialAxes())
        if (!llvm::is_contained(keptSums, axis)) keptSums.push_back(axis);

  FactorAxes factorAxes = pickFactorSplits(mesh, rule, offered, offerPriority(offered, isWeight));
  dropInexpressibleSplits(mesh, rule, factorAxes);

  // A sharding uses an axis once: a kept sum over an axis that now splits a factor is not passed on.
  SmallVector<StringRef> split = splitAxes(factorAxes), passed;
  for (StringRef axis : keptSums)
    if (!llvm::is_contained(split, axis)) passed.push_back(axis);

  OpShardings shardings;
  for (auto [tensor, keeps] : llvm::zip(rule.getOperands(), keepsPendingSum))
    shardings.operands.push_back(shardingOf(mesh, tensor, factorAxes, keeps ? passed : SmallVector<StringRef>()));
  for (TensorFactorsAttr tensor : rule.getResults()) {
    SmallVector<StringRef> partial(passed);
    llvm::append_range(partial, missingReductionAxes(rule, tensor, factorAxes));
    shardings.results.push_back(shardingOf(mesh, tensor, factorAxes, partial));
  }
  return shardings;
}

}  // namespace mlir::dg
