#ifndef DIALECTS_DG_IR_DGINTERFACES_H
#define DIALECTS_DG_IR_DGINTERFACES_H

#include <string>

#include "llvm/ADT/SmallVector.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/OpDefinition.h"

namespace mlir::dg {

// A factor-based sharding rule. Each operand/result dimension names a factor (or kNoFactor for a
// broadcast size-1 dimension that never shards); each factor has a size and a kind.
struct ShardingRule {
  enum class FactorKind {
    PassThrough,      // split it the same way on every tensor it appears in
    Reduction,        // split on operands, the results become partial (pending reduction)
    NeedReplication,  // must be whole (e.g. a softmax or norm axis, a reshape's merged dims)
  };
  static constexpr int64_t kNoFactor = -1;

  llvm::SmallVector<int64_t> factorSizes;
  llvm::SmallVector<FactorKind> factorKinds;
  llvm::SmallVector<llvm::SmallVector<int64_t>> operandFactors;
  llvm::SmallVector<llvm::SmallVector<int64_t>> resultFactors;

  // "([i, k], [k, j]) -> ([i, j]) reduction={k}": factors are named i, j, k, ... in order of
  // first appearance; a broadcast dimension prints as 1.
  std::string str() const;
};

}  // namespace mlir::dg

#include "dialects/dg/IR/DgInterfaces.h.inc"

#endif
