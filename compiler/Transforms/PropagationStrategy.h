// Which sharding dg-shard-propagate gives an op when its operands disagree (docs/parallelism.md,
// "Annotation and propagation"): which operands keep their pending sums, in which order operands
// offer their splits, and which split a factor keeps when two offers conflict. The projections
// between shardings and factors it builds on are ShardingProjection.h's; what the op's operands
// are (a weight, a gradient buffer) is the pass's to say.
#ifndef COMPILER_TRANSFORMS_PROPAGATIONSTRATEGY_H
#define COMPILER_TRANSFORMS_PROPAGATIONSTRATEGY_H

#include "compiler/Transforms/ShardingConsistency.h"
#include "compiler/Transforms/ShardingProjection.h"

namespace mlir::dg {

// Which operands keep their pending sums through an op that is `linear` in them: add-like ops keep
// every operand's when any is partial, product-like ones only a lone partial operand's, the rest the
// first operand's. The others must be resolved before the op consumes them.
SmallVector<bool> operandsKeepingPendingSums(LinearOperands linear, ArrayRef<ShardingAttr> offered);

// The order in which operands offer their splits: weights first, then the most split (counting
// axes over dimensions), ties in operand order.
SmallVector<unsigned> offerPriority(ArrayRef<ShardingAttr> offered, ArrayRef<bool> isWeight);

// The factors' splits the offered operands agree on, taken in `priority` order: a factor keeps the
// first split offered for it and a later operand that disagrees is resharded; an axis another factor
// already took ends the split, so the factor keeps the major axes before it (tokens split over
// {dp, ep} meeting experts split over ep stay split over dp). Need-replication factors stay whole.
FactorAxes pickFactorSplits(const Mesh& mesh, ShardingRuleAttr rule, ArrayRef<ShardingAttr> offered,
                            ArrayRef<unsigned> priority);

// The shardings in which an op consumes its operands and gives its results.
struct OpShardings {
  SmallVector<ShardingAttr> operands;
  SmallVector<ShardingAttr> results;
};

// The whole choice for one op: factor splits from the offers (pickFactorSplits) less those some tensor
// cannot express, the operands that keep their pending sums (`keepsPendingSum`) passing on the
// sums' axes no factor is split over, and each result partial over those and its missing reduction
// factors' axes. `offered` must already be resolved where an operand does not keep its sum.
OpShardings shardThroughRule(const Mesh& mesh, ShardingRuleAttr rule, ArrayRef<ShardingAttr> offered,
                             ArrayRef<bool> keepsPendingSum, ArrayRef<bool> isWeight);

}  // namespace mlir::dg

#endif
