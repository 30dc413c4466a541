#ifndef DIALECTS_DG_IR_DGDIALECT_H
#define DIALECTS_DG_IR_DGDIALECT_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/Dialect.h"

#include "dialects/dg/IR/DgOpsDialect.h.inc"

namespace mlir::dg {

// Attribute names the dialect owns (verified by DgDialect::verifyOperationAttribute).
inline constexpr llvm::StringLiteral kEntryAttr = "dg.entry";    // on func.func: the entry-point name
inline constexpr llvm::StringLiteral kBucketAttr = "dg.bucket";  // on func.func: {dim = size : i64}
inline constexpr llvm::StringLiteral kMeshAttr = "dg.mesh";      // on the module: {axis = size : i64}

}  // namespace mlir::dg

#endif
