#ifndef DIALECTS_DG_IR_DGOPS_H
#define DIALECTS_DG_IR_DGOPS_H

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgInterfaces.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/PatternMatch.h"
#include "mlir/Interfaces/InferTypeOpInterface.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

namespace mlir::dg {

// Shared verifiers, called from the ODS-generated verify() of op families.
// The result's shape is the NumPy broadcast of all the operands' shapes.
LogicalResult verifyBroadcastShape(Operation* op);
LogicalResult verifyBroadcastBinaryOp(Operation* op);
LogicalResult verifyReduceOp(Operation* op);
LogicalResult verifyCollectiveOp(Operation* op);
// The size of a collective's mesh axis (its `axis` attribute in the module's dg.mesh); none when
// the axis is not declared, which the collectives' verifiers reject.
std::optional<int64_t> collectiveGroupSize(Operation* op);
// The collectives that work in place (all_reduce, broadcast, reduce_to_root): the result takes
// the input's storage when collectiveWorksInPlace, and a copy of the input otherwise.
bool isInPlaceCollective(Operation* op);

// Result types inferred from the operands (InferTypeOpInterface) for op families; they fail, with an
// error at `location` when there is one, on operands that the ops' verifiers reject.
// The broadcast shape of all `operands`, with `elementOf`'s element type.
LogicalResult inferBroadcastType(std::optional<Location> location, ValueRange operands, Value elementOf,
                                 SmallVectorImpl<Type>& inferred);
// `input` without the reduced `dims` (size 1 with keepDims), in its element type.
LogicalResult inferReduceType(std::optional<Location> location, Value input, ArrayRef<int64_t> dims, bool keepDims,
                              SmallVectorImpl<Type>& inferred);
// Whether each actual result type is the inferred one, or its f32 widening from a 16-bit float
// (isWideningResult): the result-type check of the ops that may widen.
bool isSameOrWidened(TypeRange inferred, TypeRange actual);

// NumPy broadcast of two shapes; failure if incompatible.
FailureOr<SmallVector<int64_t>> broadcastShapes(ArrayRef<int64_t> lhs, ArrayRef<int64_t> rhs);
// NumPy broadcast of every ranked tensor type in `types`; failure if incompatible. The one rule the
// broadcasting ops' verifier and their type inference share.
FailureOr<SmallVector<int64_t>> broadcastShapeOf(TypeRange types);
// `shape` without the reduced `dims` (size 1 with keepDims): the reductions' result shape, shared by
// their verifier and their type inference.
SmallVector<int64_t> reducedShape(ArrayRef<int64_t> shape, ArrayRef<int64_t> dims, bool keepDims);

// Whether an op computing from `operandElement` may produce `resultElement`: the same type, or f32
// from a 16-bit float (a result computed in f32 and not rounded: dg-f32-gradient-accumulation). Allowed
// for matmul, the reductions and scatter_add.
bool isWideningResult(Type operandElement, Type resultElement);

// The element type of dg.moe_experts' gate_up_rows for an input of element type `input`: the
// precision the experts compute in, f32 for a 16-bit float, the input's type otherwise. The rows are
// then exactly what the backward would compute again, whatever the dtype (docs/training.md,
// "Expert activations").
Type gateUpRowsElementType(Type input);

// The plan dtype name of a fused_elementwise value of element type `element` (f32, f64, bf16, f16,
// bool for i1), as its program spells it; empty for any other type.
StringRef fusedElementwiseDTypeName(Type element);

// The parameter a result may be written into directly, when its only use is the dg.assign to that
// parameter: a dg.adamw result assigned back to the operand it updates (the kernel reads every
// element before it writes it, so updating in place is exact), or a dg.select that keeps the
// parameter on one side (of the parameter's type, with no read of the parameter between the select
// and the assign; the self-conditioning state of a denoise entry). The memory planner gives such a
// result no scratch and the plan drops the assign's copy. Null for any other value.
Value inPlaceAssignTarget(Value result);

// Storage, as the memory planner and the plan lowering share it. A value's storage root: reshapes
// and stop_gradients are views of their input's storage, an in-place collective that
// collectiveWorksInPlace shares its input's (a parameter's, when it overwrites one), and an
// optimizer update or a select assigned straight back is written into its parameter
// (inPlaceAssignTarget).
Value storageRoot(Value value);
// The bytes a tensor of `type` occupies (i1 is stored as a byte).
int64_t storageBytes(RankedTensorType type);
// Whether a root lives in the persistent arena (a parameter or a constant).
bool isPersistentStorage(Value root);
// Whether a scratch storage root belongs to the communication pool: a collective's own result
// (an all_gather, a reduce_scatter, an all_to_all's rows and counts, or the copy an in-place
// collective works on when its input is still read). Every other scratch root is an activation.
bool isCommunicationBuffer(Value root);
// Whether in-place collective `op` may reduce into its input's storage: nothing else reads the
// input, and that storage is not persistent (it would overwrite a parameter's or constant's bytes),
// or it is a parameter that collectiveOverwritesParameter allows.
bool collectiveWorksInPlace(Operation* op);
// Whether in-place collective `op` may reduce into the persistent bytes of the parameter its input
// is (through views, or collectives that do the same): the entry reads that parameter through `op`
// alone and assigns it a new value after the last read of `op`'s result, so the reduced bytes are
// never seen outside the entry. optimizer_step's reductions of the gradient buffers, which it zeroes
// after the update, are such (docs/parallelism.md, "Gradient reduction"): reduced in place they need
// no communication buffer.
bool collectiveOverwritesParameter(Operation* op);

}  // namespace mlir::dg

#define GET_OP_CLASSES
#include "dialects/dg/IR/DgOps.h.inc"

#endif
