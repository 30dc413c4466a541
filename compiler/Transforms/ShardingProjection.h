// Projection between tensor shardings and the factors of an op's sharding rule (docs/parallelism.md,
// "Annotation and propagation"): how the mesh axes of each tensor dimension split the dimension's
// factors, and, back, which axes each dimension and result is split or summed over once every
// factor's split is known. Pure functions of the rule, the mesh and the shardings; which split a
// factor takes when tensors disagree is PropagationStrategy.h's business.
#ifndef COMPILER_TRANSFORMS_SHARDINGPROJECTION_H
#define COMPILER_TRANSFORMS_SHARDINGPROJECTION_H

#include <optional>

#include "dialects/dg/IR/DgMesh.h"
#include "llvm/ADT/SmallVector.h"

namespace mlir::dg {

// The mesh axes each factor of a rule is split over, major to minor, indexed by factor; empty: the
// factor is not split. No axis splits two factors.
using FactorAxes = SmallVector<SmallVector<StringRef>>;

// How the axes of one dimension split its factors, major to minor: each factor takes axes while their
// product divides its size, and the next factor gets axes only when this one is split completely.
// One entry per factor of the dimension (empty: not split); nullopt when axes are left over.
std::optional<SmallVector<SmallVector<StringRef>>> splitDimOverFactors(const Mesh& mesh, ShardingRuleAttr rule,
                                                                       ArrayRef<int64_t> dimFactors,
                                                                       ArrayRef<StringRef> axes);

// Drops the split of every factor that some operand or result cannot express: a minor factor of a
// dimension may be split only when the major factors before it are split completely. Repeats until
// nothing changes, since a dropped split can make a factor after it inexpressible elsewhere.
void dropInexpressibleSplits(const Mesh& mesh, ShardingRuleAttr rule, FactorAxes& factorAxes);

// Every axis some factor is split over.
SmallVector<StringRef> splitAxes(const FactorAxes& factorAxes);

// The axes of each dimension of `tensor`: its factors' axes, major to minor, up to the first factor
// that is not split.
SmallVector<SmallVector<StringRef>> projectToDims(TensorFactorsAttr tensor, const FactorAxes& factorAxes);

// The axes of the split reduction factors that `tensor` lacks, in factor order: over them a result
// is a pending sum.
SmallVector<StringRef> missingReductionAxes(ShardingRuleAttr rule, TensorFactorsAttr tensor,
                                            const FactorAxes& factorAxes);

// The sharding of `tensor` under `factorAxes`, partial over `partial` (put in the mesh's order).
ShardingAttr shardingOf(const Mesh& mesh, TensorFactorsAttr tensor, const FactorAxes& factorAxes,
                        ArrayRef<StringRef> partial);

}  // namespace mlir::dg

#endif
