// The projections of ShardingProjection.h.
#include "compiler/Transforms/ShardingProjection.h"

#include "compiler/Transforms/ShardingConsistency.h"

namespace mlir::dg {

std::optional<SmallVector<SmallVector<StringRef>>> splitDimOverFactors(const Mesh& mesh, ShardingRuleAttr rule,
                                                                       ArrayRef<int64_t> dimFactors,
                                                                       ArrayRef<StringRef> axes) {
  SmallVector<SmallVector<StringRef>> split(dimFactors.size());
  size_t next = 0;
  for (auto [index, factor] : llvm::enumerate(dimFactors)) {
    int64_t size = rule.getFactorSizes()[factor], product = 1;
    while (next < axes.size()) {
      int64_t axisSize = mesh.axisSize(axes[next]).value_or(1);
      if (size % (product * axisSize) != 0) break;
      product *= axisSize;
      split[index].push_back(axes[next++]);
    }
    if (product != size) break;
  }
  if (next != axes.size()) return std::nullopt;
  return split;
}

void dropInexpressibleSplits(const Mesh& mesh, ShardingRuleAttr rule, FactorAxes& factorAxes) {
  SmallVector<TensorFactorsAttr> tensors(rule.getOperands());
  llvm::append_range(tensors, rule.getResults());
  for (bool changed = true; changed;) {
    changed = false;
    for (TensorFactorsAttr tensor : tensors)
      for (int64_t d = 0; d < tensor.getRank(); ++d) {
        bool majorComplete = true;
        for (int64_t factor : tensor.getDimFactors(d)) {
          SmallVector<StringRef>& axes = factorAxes[factor];
          if (axes.empty()) {
            majorComplete = false;
            continue;
          }
          if (!majorComplete) {
            axes.clear();
            changed = true;
            continue;
          }
          majorComplete = axesSize(mesh, axes) == rule.getFactorSizes()[factor];
        }
      }
  }
}

SmallVector<StringRef> splitAxes(const FactorAxes& factorAxes) {
  SmallVector<StringRef> axes;
  for (const SmallVector<StringRef>& factor : factorAxes) llvm::append_range(axes, factor);
  return axes;
}

SmallVector<SmallVector<StringRef>> projectToDims(TensorFactorsAttr tensor, const FactorAxes& factorAxes) {
  SmallVector<SmallVector<StringRef>> dims;
  for (int64_t d = 0; d < tensor.getRank(); ++d) {
    SmallVector<StringRef> axes;
    for (int64_t factor : tensor.getDimFactors(d)) {
      if (factorAxes[factor].empty()) break;
      llvm::append_range(axes, factorAxes[factor]);
    }
    dims.push_back(axes);
  }
  return dims;
}

SmallVector<StringRef> missingReductionAxes(ShardingRuleAttr rule, TensorFactorsAttr tensor,
                                            const FactorAxes& factorAxes) {
  SmallVector<StringRef> axes;
  for (int64_t factor = 0; factor < rule.getNumFactors(); ++factor) {
    if (rule.getFactorKinds()[factor] != FactorKind::Reduction || factorAxes[factor].empty()) continue;
    bool present = false;
    for (int64_t d = 0; d < tensor.getRank(); ++d) present |= llvm::is_contained(tensor.getDimFactors(d), factor);
    if (!present) llvm::append_range(axes, factorAxes[factor]);
  }
  return axes;
}

ShardingAttr shardingOf(const Mesh& mesh, TensorFactorsAttr tensor, const FactorAxes& factorAxes,
                        ArrayRef<StringRef> partial) {
  return ShardingAttr::get(tensor.getContext(), projectToDims(tensor, factorAxes), inMeshOrder(mesh, partial));
}

}  // namespace mlir::dg
