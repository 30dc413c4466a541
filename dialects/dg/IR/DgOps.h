#ifndef DIALECTS_DG_IR_DGOPS_H
#define DIALECTS_DG_IR_DGOPS_H

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgInterfaces.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::dg {

// Shared verifiers, called from the ODS-generated verify() of op families.
// The result's shape is the NumPy broadcast of all the operands' shapes.
LogicalResult verifyBroadcastShape(Operation* op);
LogicalResult verifyBroadcastBinaryOp(Operation* op);
LogicalResult verifyReduceOp(Operation* op);
LogicalResult verifyCollectiveOp(Operation* op);

// NumPy broadcast of two shapes; failure if incompatible.
FailureOr<SmallVector<int64_t>> broadcastShapes(ArrayRef<int64_t> lhs, ArrayRef<int64_t> rhs);

}  // namespace mlir::dg

#define GET_OP_CLASSES
#include "dialects/dg/IR/DgOps.h.inc"

#endif
