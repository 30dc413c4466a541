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
inline constexpr llvm::StringLiteral kMeshAttr = "dg.mesh";      // on the module: {axis = size : i64}
// Written by dg-memory-plan and read by the plan lowering: on each op with scratch results, one
// scratch-arena byte offset per result (-1: the result lives in a parameter, see
// inPlaceAssignTarget); on each entry point, its scratch arena's size in bytes.
inline constexpr llvm::StringLiteral kOffsetsAttr = "dg.offsets";
inline constexpr llvm::StringLiteral kScratchBytesAttr = "dg.scratch_bytes";
// Written by the sharding passes: on an op, one #dg.sharding per result (docs/parallelism.md, "How
// the passes shard").
inline constexpr llvm::StringLiteral kShardingsAttr = "dg.shardings";

}  // namespace mlir::dg

#endif
