// What makes an op's operand and result shardings agree with its sharding rule
// (docs/parallelism.md, "Annotation and propagation"): the conditions dg-shard-verify checks and
// dg-shard-propagate builds to.
#ifndef COMPILER_TRANSFORMS_SHARDINGCONSISTENCY_H
#define COMPILER_TRANSFORMS_SHARDINGCONSISTENCY_H

#include <optional>

#include "dialects/dg/IR/DgMesh.h"
#include "dialects/dg/IR/DgOps.h"
#include "mlir/IR/BuiltinOps.h"

namespace mlir::dg {

// The op's sharding rule as the partitioner reads it: dg.gather's table rows may be split (each rank
// looks up its own rows at a row offset, so the result is a pending sum over their axes) and so may
// dg.scatter_add's result rows (each rank adds only the ids that fall in its rows). Null when the
// op has no rule.
ShardingRuleAttr effectiveShardingRule(Operation* op);

// Which operands a pending sum may pass through (the op is linear in them).
enum class LinearOperands {
  None,       // every operand must be whole (not partial)
  AllAlike,   // add, sub, concat: all operands partial over the same axes
  AtMostOne,  // mul, matmul: one operand partial, the others whole
  First,      // div (the numerator), and single-operand linear ops
};
LinearOperands linearOperandsOf(Operation* op);

// The product of the axes' sizes.
int64_t axesSize(const Mesh& mesh, ArrayRef<StringRef> axes);
// `axes` in the mesh's order, without repeats.
SmallVector<StringRef> inMeshOrder(const Mesh& mesh, ArrayRef<StringRef> axes);

// The result sharding (dg.shardings) of a value, or null when its producer has none.
ShardingAttr resultShardingOf(Value value);
// The sharding in which `op` consumes operand `index` (dg.operand_shardings), or null.
ShardingAttr operandShardingOf(Operation* op, unsigned index);

// Checks every op of every function of the module: shardings on every op with results and operand
// shardings on every op with operands; each factor split the same way wherever it appears (only
// pass-through and reduction factors, a dimension's factors split major to minor); each result
// partial exactly over the axes of the reduction factors it lacks plus the pending sums its linear
// operands carry; pending sums only on linear operands; dg.assign consuming its value in the target
// parameter's sharding; dg.output never partial; one sharding per parameter name. Emits an error
// on the first op that breaks a condition.
LogicalResult verifyShardingConsistency(ModuleOp module);

}  // namespace mlir::dg

#endif
