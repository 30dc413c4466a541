#ifndef DIALECTS_DG_IR_DGDIALECT_H
#define DIALECTS_DG_IR_DGDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Dialect.h"

#include "dialects/dg/IR/DgAttrs.h"

#include "dialects/dg/IR/DgOpsDialect.h.inc"

namespace mlir::dg {

// Attribute names the dialect owns (verified by DgDialect::verifyOperationAttribute).
inline constexpr llvm::StringLiteral kEntryAttr = "dg.entry";    // on func.func: the entry-point name
inline constexpr llvm::StringLiteral kBucketAttr = "dg.bucket";  // on func.func: {dim = size : i64}
inline constexpr llvm::StringLiteral kMeshAttr = "dg.mesh";      // on the module: a #dg.mesh
// Written by dg-memory-plan and read by the plan lowering: on each op with scratch results, one
// byte offset per result within the result's scratch pool (-1: the result lives in a parameter, see
// inPlaceAssignTarget); on each entry point, the bytes of its two scratch pools: activations
// (dg.scratch_bytes) and communication buffers (dg.comm_buffer_bytes: the results of collectives
// that do not work in place, isCommunicationBuffer).
inline constexpr llvm::StringLiteral kOffsetsAttr = "dg.offsets";
inline constexpr llvm::StringLiteral kScratchBytesAttr = "dg.scratch_bytes";
inline constexpr llvm::StringLiteral kCommBufferBytesAttr = "dg.comm_buffer_bytes";
// Written by the sharding passes: on an op, one #dg.sharding per result (docs/parallelism.md, "How
// the passes shard").
inline constexpr llvm::StringLiteral kShardingsAttr = "dg.shardings";
// Written by dg-shard-propagate: on an op, one #dg.sharding per operand, the layout in which the op
// consumes it (the partitioner reshards a producer's result into it).
inline constexpr llvm::StringLiteral kOperandShardingsAttr = "dg.operand_shardings";
// Set by the model on each dg.param: how tensor and expert parallelism split it
// (docs/parallelism.md, "Tensor-parallel mapping"); dg-shard-annotate reads it.
inline constexpr llvm::StringLiteral kRoleAttr = "dg.role";
// On a dg.param: a model weight dg-lora froze under adapters; dg-base-dtype may change its storage.
inline constexpr llvm::StringLiteral kFrozenBaseAttr = "dg.frozen_base";
inline constexpr llvm::StringLiteral kRoleVocab = "vocab";        // dim 0 over the tensor group
inline constexpr llvm::StringLiteral kRoleColumn = "column";      // dim 0 (outputs) over the tensor group
inline constexpr llvm::StringLiteral kRoleRow = "row";            // dim 1 (inputs) over the tensor group
inline constexpr llvm::StringLiteral kRoleExperts = "experts";    // dim 0 over the expert group
inline constexpr llvm::StringLiteral kRoleReplicated = "replicated";
// Written by dg-shard-partition on dg.param, dg.input and dg.output of one rank's program: the
// tensor's global shape and where this rank's box (the local type's shape) starts in it; the plan
// lowering records them as the buffer's box.
inline constexpr llvm::StringLiteral kGlobalShapeAttr = "dg.global_shape";
inline constexpr llvm::StringLiteral kShardOffsetAttr = "dg.shard_offset";
// Written by dg-shard-partition on a dg.param whose storage holds one rank's share of a pending sum
// (a gradient buffer): the tensor is the sum of the boxes every rank holds.
inline constexpr llvm::StringLiteral kPendingSumAttr = "dg.pending_sum";

}  // namespace mlir::dg

#endif
