#ifndef DG_OPS_TD
#define DG_OPS_TD

include "dialects/dg/IR/DgAttrs.td"
include "dialects/dg/IR/DgDialect.td"
include "dialects/dg/IR/DgInterfaces.td"
include "mlir/IR/BuiltinAttributes.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

//===----------------------------------------------------------------------===//
// Type constraints
//===----------------------------------------------------------------------===//

def Dg_FloatTensor : RankedTensorOf<[F32, F64, BF16, F16]>;
def Dg_IdTensor : RankedTensorOf<[I32, I64]>;
// ui8: the packed NF4 codes of a frozen base weight (dg.dequantize).
def Dg_Tensor : RankedTensorOf<[F32, F64, BF16, F16, I64, I32, I8, UI8, I1]>;
def Dg_KeyTensor : RankedTensorOf<[I64]>;

// The global index of a rank's first row or expert (row_offset, expert_offset; docs/kernels.md); absent
// means 0. Read as the IntegerAttr itself so that ODS generates no builder taking a raw integer: that
// builder would set an explicit 0 on every op built without an offset, and the 0 would reach every
// plan.
def Dg_OffsetAttr : SignlessIntegerAttrBase<I64, "64-bit signless integer offset"> {
  let returnType = [{ ::mlir::IntegerAttr }];
  let convertFromStorage = [{ $_self }];
}

// Every dg op states how it shards and what it costs; the definitions call shared C++ helpers.
class Dg_ComputeOp<string mnemonic, list<Trait> traits = []>
    : Dg_Op<mnemonic, !listconcat(traits, [
        DeclareOpInterfaceMethods<Dg_ShardingRuleOpInterface>,
        DeclareOpInterfaceMethods<Dg_CostOpInterface>])>;

//===----------------------------------------------------------------------===//
// Graph boundary
//===----------------------------------------------------------------------===//

def Dg_ParamOp : Dg_ComputeOp<"param", [Pure]> {
  let summary = "A named model parameter (HF checkpoint name)";
  let description = [{
    `init` describes how `--init random` draws it: `{kind = "normal", std = 0.02}`,
    `{kind = "uniform", bound = b}` (U(-b, b): a LoRA A matrix), `{kind = "ones"}` or `{kind = "zeros"}`. Parameters with the same name in one module are the same tensor and must
    agree in type.
  }];
  let arguments = (ins StrAttr:$name, OptionalAttr<DictionaryAttr>:$init,
                       DefaultValuedAttr<BoolAttr, "true">:$trainable);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Dg_InputOp : Dg_ComputeOp<"input", [Pure]> {
  let summary = "A named batch field fed to the entry point";
  let arguments = (ins StrAttr:$name);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$name attr-dict `:` type($result)";
  let hasVerifier = 1;
}

def Dg_OutputOp : Dg_Op<"output", [MemoryEffects<[MemWrite]>]> {
  let summary = "Hands a value out of the entry point under a name";
  let arguments = (ins StrAttr:$name, Dg_Tensor:$value);
  let assemblyFormat = "$name `,` $value attr-dict `:` type($value)";
}

def Dg_AssignOp : Dg_Op<"assign", [MemoryEffects<[MemWrite]>, AllTypesMatch<["target", "value"]>]> {
  let summary = "Writes a value into a parameter's persistent storage";
  let description = [{
    `target` is a `dg.param` of the value's type. When the step runs, the parameter's storage takes
    the value, so the next entry point that reads the parameter sees it: this is how the optimizer
    update, written as dg ops, changes weights and optimizer state in place. Ops that read the
    parameter must come before the assign (the verifier checks it within the entry point).
  }];
  let arguments = (ins Dg_Tensor:$target, Dg_Tensor:$value);
  let assemblyFormat = "$value `to` $target attr-dict `:` type($value)";
  let hasVerifier = 1;
}

def Dg_ConstantOp : Dg_ComputeOp<"constant",
    [ConstantLike, Pure, DeclareOpInterfaceMethods<InferTypeOpInterface>]> {
  let summary = "A compile-time tensor (stored in the plan's constant section)";
  let arguments = (ins ElementsAttr:$value);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "attr-dict $value";
  let hasFolder = 1;
}

def Dg_FillOp : Dg_ComputeOp<"fill", [Pure]> {
  let summary = "A tensor with one value everywhere";
  let arguments = (ins F64Attr:$value);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$value attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

class Dg_BinaryOp<string mnemonic, list<Trait> traits = []>
    : Dg_ComputeOp<mnemonic, !listconcat(traits, [Pure, InferTypeOpAdaptor])> {
  let description = [{
    Elementwise with NumPy broadcasting: shapes align on the right and a dimension of size 1 (or a
    missing one) stretches. Operands and result share the element type.
  }];
  let arguments = (ins Dg_FloatTensor:$lhs, Dg_FloatTensor:$rhs);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::verify() { return ::mlir::dg::verifyBroadcastBinaryOp(*this); }
    ::mlir::LogicalResult $cppClass::inferReturnTypes(::mlir::MLIRContext*, std::optional<::mlir::Location> location,
                                                      Adaptor adaptor, ::llvm::SmallVectorImpl<::mlir::Type>& inferred) {
      return ::mlir::dg::inferBroadcastType(location, adaptor.getOperands(), adaptor.getLhs(), inferred);
    }
  }];
}

class Dg_DifferentiableBinaryOp<string mnemonic>
    : Dg_BinaryOp<mnemonic, [DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]>;

def Dg_AddOp : Dg_DifferentiableBinaryOp<"add"> { let summary = "lhs + rhs"; }
def Dg_SubOp : Dg_DifferentiableBinaryOp<"sub"> { let summary = "lhs - rhs"; }
def Dg_MulOp : Dg_DifferentiableBinaryOp<"mul"> { let summary = "lhs * rhs"; }
def Dg_DivOp : Dg_DifferentiableBinaryOp<"div"> { let summary = "lhs / rhs"; }
// max/min have no derivative rule yet (a compare and a select would build it): so far they only clamp
// inputs such as the diffusion time.
def Dg_MaximumOp : Dg_BinaryOp<"maximum"> { let summary = "max(lhs, rhs)"; }
def Dg_MinimumOp : Dg_BinaryOp<"minimum"> { let summary = "min(lhs, rhs)"; }

class Dg_UnaryOp<string mnemonic, list<Trait> traits = []> : Dg_ComputeOp<mnemonic,
    !listconcat(traits, [Pure, SameOperandsAndResultType])> {
  let arguments = (ins Dg_FloatTensor:$input);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

class Dg_DifferentiableUnaryOp<string mnemonic>
    : Dg_UnaryOp<mnemonic, [DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]>;

def Dg_NegOp : Dg_DifferentiableUnaryOp<"neg"> { let summary = "-x"; }
def Dg_ExpOp : Dg_DifferentiableUnaryOp<"exp"> { let summary = "e^x"; }
def Dg_LogOp : Dg_DifferentiableUnaryOp<"log"> { let summary = "natural logarithm"; }
def Dg_TanhOp : Dg_DifferentiableUnaryOp<"tanh"> { let summary = "tanh(x)"; }
def Dg_SqrtOp : Dg_DifferentiableUnaryOp<"sqrt"> { let summary = "square root"; }
def Dg_RsqrtOp : Dg_DifferentiableUnaryOp<"rsqrt"> { let summary = "1 / sqrt(x)"; }
def Dg_GeluTanhOp : Dg_DifferentiableUnaryOp<"gelu_tanh"> {
  let summary = "GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))";
}

def Dg_CastOp : Dg_ComputeOp<"cast", [Pure, SameOperandsAndResultShape,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Element type conversion; float narrowing rounds to nearest even";
  let description = [{
    Rounding is explicit in the IR so that bf16 mixed precision is visible to every pass and the CPU
    backend rounds exactly where a GPU would. Float to integer is not allowed (use a dedicated op).
  }];
  let arguments = (ins Dg_Tensor:$input);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Dg_DequantizeOp : Dg_ComputeOp<"dequantize", [Pure]> {
  let summary = "A frozen base weight decoded from its int8 or NF4 codes and scales";
  let description = [{
    `format = "int8"`: codes i8 of the weight's shape, scales f32 of its shape without the last
    dimension (one per output channel); value = code * scale. `format = "nf4"`: codes ui8 of the
    weight's shape with the last dimension halved (two 4-bit codes per byte, the even element in the
    high nibble), scales f32 with the last dimension over 64 (the absmax of each block of 64
    consecutive elements of a row); value = nf4_table[code] * absmax. The product is formed in f32 and
    rounded once to the result's float type, the activation dtype at the use (docs/training.md,
    "Frozen low-precision base"). Built by dg-base-dtype for weights marked `dg.frozen_base`: its
    operands are frozen parameters, off autodiff's active path, so it has no derivative rule. The
    leading dimensions of codes, scales and result are one factor each, so the three shard alike; the
    last is whole NF4 blocks (int8: the row itself) and splits on block boundaries only.
  }];
  let arguments = (ins RankedTensorOf<[I8, UI8]>:$codes, RankedTensorOf<[F32]>:$scales, StrAttr:$format);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = [{
    $codes `,` $scales `format` `=` $format attr-dict `:` type($codes) `,` type($scales) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Dg_CompareOp : Dg_ComputeOp<"compare", [Pure, InferTypeOpAdaptor]> {
  let summary = "Elementwise lhs <predicate> rhs with NumPy broadcasting, as i1";
  let description = [{
    `predicate` is one of `lt`, `le`, `gt`, `ge`, `eq`, `ne` (#dg.predicate), with IEEE semantics: every comparison
    with a NaN is false except `ne`. The operands share a float element type; the result has their
    broadcast shape. There is no derivative rule: a comparison is piecewise constant, and it only
    ever acts on inputs (the diffusion time, masks, random draws).
  }];
  let arguments = (ins Dg_FloatTensor:$lhs, Dg_FloatTensor:$rhs, Dg_ComparePredicateAttr:$predicate);
  let results = (outs RankedTensorOf<[I1]>:$result);
  let assemblyFormat = [{
    $lhs `,` $rhs `predicate` `=` `` $predicate attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Dg_SelectOp : Dg_ComputeOp<"select", [Pure, InferTypeOpAdaptor]> {
  let summary = "Elementwise condition ? on_true : on_false with NumPy broadcasting among all three";
  let description = [{
    `condition` is i1; `on_true`, `on_false` and the result share any element type (floats, ids). The
    result has the broadcast shape of the three operands. There is no derivative rule: so far it only
    picks between inputs (token ids, masks), never between values that depend on parameters.
  }];
  let arguments = (ins RankedTensorOf<[I1]>:$condition, Dg_Tensor:$on_true, Dg_Tensor:$on_false);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = [{
    $condition `,` $on_true `,` $on_false attr-dict `:` type($condition) `,` type($on_true) `,` type($on_false)
    `->` type($result)
  }];
  let hasVerifier = 1;
}

def Dg_FusedElementwiseOp : Dg_Op<"fused_elementwise", [Pure,
    DeclareOpInterfaceMethods<Dg_CostOpInterface>]> {
  let summary = "A chain of elementwise ops evaluated per element in one kernel (dg-fuse-elementwise)";
  let description = [{
    `program` lists the chain's ops in the text of `plan/FusedElementwiseProgram.h`: values 0 … n−1
    are the inputs, instruction i defines value n + i, and the last one is the result, e.g.
    `"add f32 0 1; gelu_tanh f32 2"`. Each instruction computes exactly what its op's kernel computes,
    rounded to its dtype, so the fused op equals the chain bit for bit. Every input broadcasts
    (NumPy rules) to the result's shape, which every instruction's value has. Built only by
    dg-fuse-elementwise, after autodiff, sharding and recomputation: it has no derivative or sharding
    rule.
  }];
  let arguments = (ins Variadic<Dg_Tensor>:$inputs, StrAttr:$program);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$program `(` $inputs `)` attr-dict `:` functional-type($inputs, $result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Autodiff barrier
//===----------------------------------------------------------------------===//

def Dg_StopGradientOp : Dg_ComputeOp<"stop_gradient", [Pure, SameOperandsAndResultType]> {
  let summary = "Identity that reverse-mode autodiff does not differentiate through";
  let description = [{
    The value passes unchanged, but dg-autodiff treats the result as a constant: nothing upstream is
    differentiated through this use (a parameter reached only through it gets a zero gradient, one
    also used directly gets only the direct contribution). It has no folder, so it survives
    canonicalization until dg-autodiff has read it; after planning it is a view of its input (no
    copy, no kernel step), like dg.reshape.
  }];
  let arguments = (ins Dg_Tensor:$input);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Contractions, normalisation, reductions
//===----------------------------------------------------------------------===//

def Dg_MatmulOp : Dg_ComputeOp<"matmul", [Pure, InferTypeOpAdaptorWithIsCompatible,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Batched matrix product";
  let description = [{
    lhs `[..., M, K]` (`[..., K, M]` with `transpose_a`), rhs `[K, N]` (`[N, K]` with `transpose_b`)
    shared by every batch, or with lhs's batch dimensions. Result `[..., M, N]`.
  }];
  let arguments = (ins Dg_FloatTensor:$lhs, Dg_FloatTensor:$rhs,
                       DefaultValuedAttr<BoolAttr, "false">:$transpose_a,
                       DefaultValuedAttr<BoolAttr, "false">:$transpose_b);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($lhs) `,` type($rhs) `->` type($result)";
  let hasVerifier = 1;
}

def Dg_RmsNormOp : Dg_ComputeOp<"rms_norm", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "RMS normalisation over the last dimension, optionally weighted";
  let description = [{
    `y = x * (mean(x^2, -1) + eps)^(-1/2)`, then `* weight` when given (the weight is used as is, not
    `1 + weight`). The weightless form serves Gemma 4's v-norm and router norm.
  }];
  let arguments = (ins Dg_FloatTensor:$input, Optional<Dg_FloatTensor>:$weight, F64Attr:$eps);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$input (`,` $weight^)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dg_RmsNormBackwardOp : Dg_ComputeOp<"rms_norm_backward", [Pure, AllTypesMatch<["input", "grad_output", "grad_input"]>]> {
  let summary = "Gradients of dg.rms_norm: input, and weight when there is one";
  let description = [{
    With r = (mean(x², -1) + eps)^(-1/2), x̂ = x r and g = grad_output * weight (or grad_output):
    grad_input = r (g − x̂ mean(g x̂, -1)); grad_weight = Σ over all rows of grad_output x̂ (present
    exactly when the weight is). One pass per row instead of a dozen elementwise ops and reductions.
  }];
  let arguments = (ins Dg_FloatTensor:$input, Dg_FloatTensor:$grad_output, Optional<Dg_FloatTensor>:$weight, F64Attr:$eps);
  let results = (outs Dg_FloatTensor:$grad_input, Optional<Dg_FloatTensor>:$grad_weight);
  let assemblyFormat = "$input `,` $grad_output (`,` $weight^)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Dg_SoftmaxOp : Dg_ComputeOp<"softmax", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Softmax along one axis (max-subtracted)";
  let arguments = (ins Dg_FloatTensor:$input, I64Attr:$axis);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$input `axis` `=` $axis attr-dict `:` type($result)";
  let hasVerifier = 1;
}

class Dg_ReduceOp<string mnemonic, list<Trait> traits = []>
    : Dg_ComputeOp<mnemonic, !listconcat(traits, [Pure, InferTypeOpAdaptorWithIsCompatible])> {
  let arguments = (ins Dg_FloatTensor:$input, DenseI64ArrayAttr:$dims,
                       DefaultValuedAttr<BoolAttr, "false">:$keep_dims);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$input `dims` `=` $dims attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::verify() { return ::mlir::dg::verifyReduceOp(*this); }
    ::mlir::LogicalResult $cppClass::inferReturnTypes(::mlir::MLIRContext*, std::optional<::mlir::Location> location,
                                                      Adaptor adaptor, ::llvm::SmallVectorImpl<::mlir::Type>& inferred) {
      return ::mlir::dg::inferReduceType(location, adaptor.getInput(), adaptor.getDims(), adaptor.getKeepDims(), inferred);
    }
    bool $cppClass::isCompatibleReturnTypes(::mlir::TypeRange inferred, ::mlir::TypeRange actual) {
      return ::mlir::dg::isSameOrWidened(inferred, actual);
    }
  }];
}

def Dg_ReduceSumOp : Dg_ReduceOp<"reduce_sum", [DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Sum over dims";
}
def Dg_ReduceMeanOp : Dg_ReduceOp<"reduce_mean", [DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Mean over dims";
}
def Dg_ReduceMaxOp : Dg_ReduceOp<"reduce_max"> { let summary = "Maximum over dims"; }

//===----------------------------------------------------------------------===//
// Layout and indexing
//===----------------------------------------------------------------------===//

def Dg_TransposeOp : Dg_ComputeOp<"transpose", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Permutes dimensions: result.shape[k] = input.shape[perm[k]]";
  let arguments = (ins Dg_Tensor:$input, DenseI64ArrayAttr:$perm);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input `perm` `=` $perm attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
  let hasCanonicalizeMethod = 1;
}

def Dg_ReshapeOp : Dg_ComputeOp<"reshape", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Same elements in row-major order, new shape (a view after memory planning)";
  let arguments = (ins Dg_Tensor:$input);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
  let hasFolder = 1;
}

def Dg_ConcatOp : Dg_ComputeOp<"concat", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Concatenation along one dimension";
  let arguments = (ins Variadic<Dg_Tensor>:$inputs, I64Attr:$dim);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$inputs `dim` `=` $dim attr-dict `:` type($inputs) `->` type($result)";
  let hasVerifier = 1;
}

def Dg_SliceOp : Dg_ComputeOp<"slice", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "The block [start, start + size) of one dimension (size from the result type)";
  let arguments = (ins Dg_Tensor:$input, I64Attr:$dim, I64Attr:$start);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input `dim` `=` $dim `start` `=` $start attr-dict `:` type($input) `->` type($result)";
  let hasVerifier = 1;
}

def Dg_GatherOp : Dg_ComputeOp<"gather", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Row gather (embedding lookup): result[i, :] = table[ids[i] - row_offset, :]";
  let description = [{
    The table holds the global rows `[row_offset, row_offset + rows)` (a rank's block of a table split
    by rows; 0 when whole): an id inside looks up `table[id - row_offset]`, an id outside gives a row
    of zeros, so the blocks' results summed over the ranks are the whole table's gather (a
    vocab-parallel embedding).
    `padding_idx` (a global row of the table) leaves the forward unchanged; the derivative gives that
    row no gradient from lookups, as torch's `nn.Embedding(padding_idx=...)` does (the scatter_add of
    the rule skips it and gets the same `row_offset`).
  }];
  let arguments = (ins Dg_FloatTensor:$table, Dg_IdTensor:$ids, OptionalAttr<I64Attr>:$padding_idx,
                       DefaultValuedOptionalAttr<Dg_OffsetAttr, "0">:$row_offset);
  let results = (outs Dg_FloatTensor:$result);
  // Without padding_idx: ODS gives an optional attribute no default in the generated builders.
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$table, "::mlir::Value":$ids), [{
      build($_builder, $_state, result, table, ids, ::mlir::IntegerAttr(), ::mlir::IntegerAttr());
    }]>,
  ];
  let assemblyFormat = "$table `[` $ids `]` attr-dict `:` type($table) `,` type($ids) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Model ops: kept whole so that sharding, fusion and kernel selection see their structure
//===----------------------------------------------------------------------===//

def Dg_RopeOp : Dg_ComputeOp<"rope", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Rotary position embedding, rotate-half layout, optionally partial";
  let description = [{
    input `[B, T, H, D]`, positions `[B, T]`. For `i < D/2`, frequency
    `f_i = theta^(-2i/frequency_dim)` when `i < rotated_pairs`, else 0 (the pair passes through):
    Gemma 4's full layers rotate 64 of 256 pairs with `frequency_dim` 512 (proportional RoPE),
    sliding layers all pairs with `frequency_dim` = D. `inverse` rotates by -angle: the transpose,
    which is the derivative rule's cotangent map.
  }];
  let arguments = (ins Dg_FloatTensor:$input, RankedTensorOf<[I64]>:$positions, F64Attr:$theta,
                       I64Attr:$rotated_pairs, I64Attr:$frequency_dim,
                       DefaultValuedAttr<BoolAttr, "false">:$inverse);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$input `,` $positions attr-dict `:` type($input) `,` type($positions) `->` type($result)";
  let hasVerifier = 1;
}

def Dg_AttentionOp : Dg_ComputeOp<"attention", [Pure, AttrSizedOperandSegments, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Multi-head attention with GQA and a structural mask (no materialised [S x S] mask)";
  let description = [{
    query `[B, Tq, Hq, D]`, key `[B, Tk, Hkv, D]`, value `[B, Tk, Hkv, Dv]`, key_valid `[B, Tk]`
    (true for real keys). Query head h reads KV head `h / (Hq / Hkv)`. Logits are `scale * q.k`
    (Gemma 4: 1.0). `mask` (#dg.mask):
    - `causal`: queries are the last Tq of the Tk positions; key j is visible to query i when valid,
      not in the future, and (window > 0) fewer than `window` positions back. A query always sees
      its own position, so padded rows stay finite.
    - `bidirectional`: every valid key; with window > 0, only those fewer than `window` positions
      away on either side, |i' - j| < window with i' = Tk - Tq + i the query's key position (the
      sliding layers of a bidirectional pass over long packed text).
    - `prefix`: the first `prefix_len` keys are a read-only prefix (the encoder's K/V), the rest a
      block (the canvas). Every query sees the whole block and the valid prefix keys among the last
      `window` prefix slots (window 0: all of them).
    A row with no visible key produces zeros.

    `segment_ids` `[B, Tk]` (optional, causal mask only) overlays bidirectional segments, the
    encoder's image soft-token runs: query i (key position `Tk - Tq + i`) in segment s > 0 also sees
    every valid key of segment s, past or future, inside or outside the window. Segment 0 takes no
    part; without the operand the op is the plain causal mask.

    `document_ids` `[B, Tk]` (optional, any mask) keeps packed documents apart: on top of the mask's
    own rule (and the overlay), key j is visible to query i only if document_ids[b, j] equals
    document_ids[b, Tk - Tq + i], the document of the query's own key position.

    `trailing_keys` (optional, absent: 0) is the number of keys after the last query's own
    position: query i sits at key position `Tk - Tq - trailing_keys + i` for every rule above. A
    context-parallel query chunk (docs/parallelism.md, "Context parallelism") reads keys past its
    end this way, which only the image overlay can make visible.
  }];
  let arguments = (ins Dg_FloatTensor:$query, Dg_FloatTensor:$key, Dg_FloatTensor:$value,
                       RankedTensorOf<[I1]>:$key_valid, Dg_AttentionMaskAttr:$mask,
                       DefaultValuedAttr<I64Attr, "0">:$window,
                       DefaultValuedAttr<I64Attr, "0">:$prefix_len,
                       DefaultValuedAttr<F64Attr, "1.0">:$scale,
                       Optional<Dg_KeyTensor>:$segment_ids, Optional<Dg_KeyTensor>:$document_ids,
                       OptionalAttr<I64Attr>:$trailing_keys);
  let results = (outs Dg_FloatTensor:$result);
  // The builders without trailing_keys: only the context-parallel partitioner sets it.
  let builders = [
    OpBuilder<(ins "Value":$query, "Value":$key, "Value":$value, "Value":$key_valid, "AttentionMaskAttr":$mask,
                   "IntegerAttr":$window, "IntegerAttr":$prefix_len, "FloatAttr":$scale, "Value":$segment_ids,
                   "Value":$document_ids), [{
      build($_builder, $_state, query, key, value, key_valid, mask, window, prefix_len, scale, segment_ids,
            document_ids, IntegerAttr());
    }]>,
    OpBuilder<(ins "Type":$result, "Value":$query, "Value":$key, "Value":$value, "Value":$key_valid,
                   "AttentionMaskAttr":$mask, "IntegerAttr":$window, "IntegerAttr":$prefix_len, "FloatAttr":$scale,
                   "Value":$segment_ids, "Value":$document_ids), [{
      build($_builder, $_state, result, query, key, value, key_valid, mask, window, prefix_len, scale, segment_ids,
            document_ids, IntegerAttr());
    }]>
  ];
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $key_valid (`segment_ids` `(` $segment_ids^ `:` type($segment_ids) `)`)?
    (`document_ids` `(` $document_ids^ `:` type($document_ids) `)`)?
    `mask` `=` `` $mask attr-dict `:`
    type($query) `,` type($key) `,` type($value) `,` type($key_valid) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Dg_AttentionBackwardOp : Dg_ComputeOp<"attention_backward", [Pure, AttrSizedOperandSegments, InferTypeOpAdaptor]> {
  let summary = "Gradients of dg.attention: dq, dk, dv from the output gradient";
  let description = [{
    Same operands and attributes as dg.attention plus `grad_output` (the output's shape). The
    probabilities are recomputed with the same visibility rules, so nothing of the forward pass has
    to be kept alive for the backward pass. The segment and document ids, like key_valid, get no
    gradient.
  }];
  let arguments = (ins Dg_FloatTensor:$query, Dg_FloatTensor:$key, Dg_FloatTensor:$value,
                       RankedTensorOf<[I1]>:$key_valid, Dg_FloatTensor:$grad_output, Dg_AttentionMaskAttr:$mask,
                       DefaultValuedAttr<I64Attr, "0">:$window,
                       DefaultValuedAttr<I64Attr, "0">:$prefix_len,
                       DefaultValuedAttr<F64Attr, "1.0">:$scale,
                       Optional<Dg_KeyTensor>:$segment_ids, Optional<Dg_KeyTensor>:$document_ids,
                       OptionalAttr<I64Attr>:$trailing_keys);
  let results = (outs Dg_FloatTensor:$grad_query, Dg_FloatTensor:$grad_key, Dg_FloatTensor:$grad_value);
  let assemblyFormat = [{
    $query `,` $key `,` $value `,` $key_valid `,` $grad_output
    (`segment_ids` `(` $segment_ids^ `:` type($segment_ids) `)`)?
    (`document_ids` `(` $document_ids^ `:` type($document_ids) `)`)? `mask` `=` `` $mask attr-dict `:`
    type($query) `,` type($key) `,` type($value) `,` type($key_valid) `,` type($grad_output) `->`
    type($grad_query) `,` type($grad_key) `,` type($grad_value)
  }];
  let hasVerifier = 1;
}

def Dg_MoeRouteOp : Dg_ComputeOp<"moe_route", [Pure, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Router: softmax over all experts, top-k, renormalise, per-expert scale";
  let description = [{
    logits `[N, E]`, per_expert_scale `[E]` -> weights `[N, k]`, indices `[N, k]` (i64). The softmax is
    taken over all E experts before top-k (Gemma 4); ties go to the lower expert id; the k chosen
    probabilities are renormalised to sum 1 and multiplied by their experts' scale.
  }];
  let arguments = (ins Dg_FloatTensor:$logits, Dg_FloatTensor:$per_expert_scale, I64Attr:$top_k);
  let results = (outs Dg_FloatTensor:$weights, RankedTensorOf<[I64]>:$indices);
  let assemblyFormat = [{
    $logits `,` $per_expert_scale `top_k` `=` $top_k attr-dict `:` type($logits) `,` type($per_expert_scale)
    `->` type($weights) `,` type($indices)
  }];
  let hasVerifier = 1;
}

def Dg_MoeExpertsOp : Dg_ComputeOp<"moe_experts", [Pure, AttrSizedOperandSegments,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Dropless routed experts: y[n] = sum_j w[n,j] * Expert_idx[n,j](x[n])";
  let description = [{
    x `[N, H]`, weights and indices `[N, k]`, gate_up `[E, 2I, H]` (gate rows 0..I-1, then up rows),
    down `[E, H, I]`. `Expert_e(x) = (gelu_tanh(x G_e^T) * (x U_e^T)) D_e^T`. The weights may be f32
    when x is a 16-bit float (the routing weights of an fp32 router island).
    gate_up and down hold the global experts `[expert_offset, expert_offset + E)` (a rank's block of
    experts under expert parallelism; 0 when whole): a routing entry whose index lies outside adds
    nothing to y, one inside uses local expert `index - expert_offset`, so the blocks' results summed
    over the ranks are the whole op's.

    Per-expert LoRA adapters (docs/training.md, "LoRA adapters"), each pair optional:
    `lora_gate_up(A1 [E, r, H], B1 [E, 2I, r])` and `lora_down(A2 [E, r, I], B2 [E, H, r])`, of x's
    element type, with `lora_scale` s (alpha / r), present exactly when a pair is. For a route to
    expert e: `pre = x [G_e; U_e]^T + s (x A1_e^T) B1_e^T`, `act = gelu_tanh(gate) * up`,
    `out = act D_e^T + s (act A2_e^T) B2_e^T`. The low-rank products run inside the grouped expert
    kernels; `W + s B A` is never formed. The adapters hold the same experts as gate_up and down.

    The optional second result `gate_up_rows` `[N·k, 2I]` (x's element type, f32 for a 16-bit x:
    the precision the experts compute in) holds each route's pre-activations: row `n·k + j` is `x[n] [G_e; U_e]^T`
    (plus the gate_up adapter's term) for its expert e, the values the GELU
    reads; a route to an expert outside the block gets a zero row. dg-keep-expert-activations adds it
    so that dg.moe_experts_backward reads them instead of computing that product again.
  }];
  let arguments = (ins Dg_FloatTensor:$input, Dg_FloatTensor:$weights, RankedTensorOf<[I64]>:$indices,
                       Dg_FloatTensor:$gate_up, Dg_FloatTensor:$down,
                       Optional<Dg_FloatTensor>:$lora_gate_up_a, Optional<Dg_FloatTensor>:$lora_gate_up_b,
                       Optional<Dg_FloatTensor>:$lora_down_a, Optional<Dg_FloatTensor>:$lora_down_b,
                       DefaultValuedOptionalAttr<Dg_OffsetAttr, "0">:$expert_offset,
                       OptionalAttr<F64Attr>:$lora_scale);
  let results = (outs Dg_FloatTensor:$result, Optional<Dg_FloatTensor>:$gate_up_rows);
  // y has the input's type; the pre-activations are only ever added by dg-keep-expert-activations.
  let builders = [
    OpBuilder<(ins "::mlir::Value":$input, "::mlir::Value":$weights, "::mlir::Value":$indices,
                   "::mlir::Value":$gate_up, "::mlir::Value":$down,
                   CArg<"::mlir::IntegerAttr", "{}">:$expert_offset), [{
      build($_builder, $_state, input.getType(), ::mlir::Type(), input, weights, indices, gate_up, down,
            ::mlir::Value(), ::mlir::Value(), ::mlir::Value(), ::mlir::Value(), expert_offset, ::mlir::FloatAttr());
    }]>,
  ];
  let assemblyFormat = [{
    $input `,` $weights `,` $indices `,` $gate_up `,` $down
    (`lora_gate_up` `(` $lora_gate_up_a^ `,` $lora_gate_up_b `:` type($lora_gate_up_a) `,` type($lora_gate_up_b) `)`)?
    (`lora_down` `(` $lora_down_a^ `,` $lora_down_b `:` type($lora_down_a) `,` type($lora_down_b) `)`)?
    attr-dict `:` type($input) `,` type($weights) `,`
    type($indices) `,` type($gate_up) `,` type($down) `->` type($result) (`,` type($gate_up_rows)^)?
  }];
  let hasVerifier = 1;
}

def Dg_MoeRouteBackwardOp : Dg_ComputeOp<"moe_route_backward", [Pure]> {
  let summary = "Gradients of dg.moe_route for the weights' gradient (the choice itself has none)";
  let arguments = (ins Dg_FloatTensor:$logits, Dg_FloatTensor:$per_expert_scale, RankedTensorOf<[I64]>:$indices,
                       Dg_FloatTensor:$grad_weights, I64Attr:$top_k);
  let results = (outs Dg_FloatTensor:$grad_logits, Dg_FloatTensor:$grad_per_expert_scale);
  let assemblyFormat = [{
    $logits `,` $per_expert_scale `,` $indices `,` $grad_weights `top_k` `=` $top_k attr-dict `:` type($logits) `,`
    type($per_expert_scale) `,` type($indices) `,` type($grad_weights) `->` type($grad_logits) `,` type($grad_per_expert_scale)
  }];
}

def Dg_MoeExpertsBackwardOp : Dg_ComputeOp<"moe_experts_backward", [Pure, AttrSizedOperandSegments,
    AttrSizedResultSegments]> {
  let summary = "Gradients of dg.moe_experts: input, routing weights, gate_up, down, the adapters";
  let description = [{
    `expert_offset` as in dg.moe_experts: a routing entry to an expert this op does not hold gets a
    zero weight gradient and adds nothing to the input gradient. With `gate_up_rows` (the forward's
    second result) the pre-activations are read, not computed again from the input and gate_up.

    The adapters and `lora_scale` as in dg.moe_experts; each pair present gives its two gradients
    (`grad_lora_gate_up` and `grad_lora_down`, A's then B's). `grad_gate_up` and `grad_down` are
    optional: without them (a frozen base, whose gradients nothing reads; canonicalization drops
    them) the kernel neither computes nor allocates them.
  }];
  let arguments = (ins Dg_FloatTensor:$input, Dg_FloatTensor:$weights, RankedTensorOf<[I64]>:$indices,
                       Dg_FloatTensor:$gate_up, Dg_FloatTensor:$down, Dg_FloatTensor:$grad_output,
                       Optional<Dg_FloatTensor>:$gate_up_rows,
                       Optional<Dg_FloatTensor>:$lora_gate_up_a, Optional<Dg_FloatTensor>:$lora_gate_up_b,
                       Optional<Dg_FloatTensor>:$lora_down_a, Optional<Dg_FloatTensor>:$lora_down_b,
                       DefaultValuedOptionalAttr<Dg_OffsetAttr, "0">:$expert_offset,
                       OptionalAttr<F64Attr>:$lora_scale);
  let results = (outs Dg_FloatTensor:$grad_input, Dg_FloatTensor:$grad_weights,
                      Optional<Dg_FloatTensor>:$grad_gate_up, Optional<Dg_FloatTensor>:$grad_down,
                      Optional<Dg_FloatTensor>:$grad_lora_gate_up_a, Optional<Dg_FloatTensor>:$grad_lora_gate_up_b,
                      Optional<Dg_FloatTensor>:$grad_lora_down_a, Optional<Dg_FloatTensor>:$grad_lora_down_b);
  let assemblyFormat = [{
    $input `,` $weights `,` $indices `,` $gate_up `,` $down `,` $grad_output (`rows` $gate_up_rows^)?
    (`lora_gate_up` `(` $lora_gate_up_a^ `,` $lora_gate_up_b `:` type($lora_gate_up_a) `,` type($lora_gate_up_b) `)`)?
    (`lora_down` `(` $lora_down_a^ `,` $lora_down_b `:` type($lora_down_a) `,` type($lora_down_b) `)`)?
    attr-dict `:`
    type($input) `,` type($weights) `,` type($indices) `,` type($gate_up) `,` type($down) `,` type($grad_output)
    (`,` type($gate_up_rows)^)? `->` type($grad_input) `,` type($grad_weights)
    (`grad_gate_up` type($grad_gate_up)^)? (`grad_down` type($grad_down)^)?
    (`grad_lora_gate_up` `(` type($grad_lora_gate_up_a)^ `,` type($grad_lora_gate_up_b) `)`)?
    (`grad_lora_down` `(` type($grad_lora_down_a)^ `,` type($grad_lora_down_b) `)`)?
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

def Dg_ScatterAddOp : Dg_ComputeOp<"scatter_add", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Rows added into a table of zeros at the ids: table[ids[i], :] += updates[i, :] (gather's adjoint)";
  let description = [{
    The result holds the global rows `[row_offset, row_offset + rows)` (0 when whole): updates at ids
    outside are dropped, the others added at `id - row_offset`: the adjoint of a gather with the same
    `row_offset`. Positions whose id equals `skip_id` (a global row) add nothing, so that row stays
    zero: the adjoint of a gather with `padding_idx`. The derivative rule is that gather: an update's
    cotangent is the result cotangent's row it was added to, zero where it was dropped or skipped.
  }];
  let arguments = (ins Dg_IdTensor:$ids, Dg_FloatTensor:$updates, OptionalAttr<I64Attr>:$skip_id,
                       DefaultValuedOptionalAttr<Dg_OffsetAttr, "0">:$row_offset);
  let results = (outs Dg_FloatTensor:$result);
  // Without skip_id: ODS gives an optional attribute no default in the generated builders.
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$ids, "::mlir::Value":$updates), [{
      build($_builder, $_state, result, ids, updates, ::mlir::IntegerAttr(), ::mlir::IntegerAttr());
    }]>,
  ];
  let assemblyFormat = "$updates `at` $ids attr-dict `:` type($updates) `,` type($ids) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Losses
//===----------------------------------------------------------------------===//

def Dg_CrossEntropyOp : Dg_ComputeOp<"cross_entropy", [Pure, AttrSizedOperandSegments, InferTypeOpAdaptor,
    DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Per-position softmax cross-entropy over the last dimension, optionally with a logit bonus";
  let description = [{
    logits `[..., V]`, targets `[...]` -> `ce = logsumexp(z) - z[target]` per position, with
    `z = cap(logits) + bonus * onehot(bonus_ids)` along V: the leave-one-out objective adds `bonus` to
    the logit of the observed noisy token only. `bonus_ids` (ids) and `bonus` (the logits' element type)
    have the targets' shape and come together or not at all. `cap(x) = softcap * tanh(x / softcap)`
    when `softcap` > 0 (Gemma's final-logit soft-cap), else `x`. Fused so that neither the capped
    logits nor the `[..., V]` softmax is ever materialised.

    The derivative (dg.cross_entropy_backward) reaches the logits only. `bonus` is treated as a
    constant: it only ever depends on the diffusion time, an input, so no gradient flows to it.
  }];
  let arguments = (ins Dg_FloatTensor:$logits, Dg_IdTensor:$targets, Optional<Dg_IdTensor>:$bonus_ids,
                       Optional<Dg_FloatTensor>:$bonus, DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = [{
    $logits `,` $targets (`bonus` `(` $bonus_ids^ `,` $bonus `)`)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Dg_CrossEntropyBackwardOp : Dg_ComputeOp<"cross_entropy_backward",
    [Pure, AttrSizedOperandSegments, InferTypeOpAdaptor]> {
  let summary = "Gradient of dg.cross_entropy for the logits: grad_output[..., None] * (softmax(z) - onehot(target)) * cap'(logits)";
  let description = [{
    Same operands as dg.cross_entropy plus `grad_output` (the targets' shape); z, with the bonus, is
    recomputed, so nothing of the forward pass has to be kept alive for the backward pass.
  }];
  let arguments = (ins Dg_FloatTensor:$logits, Dg_IdTensor:$targets, Optional<Dg_IdTensor>:$bonus_ids,
                       Optional<Dg_FloatTensor>:$bonus, Dg_FloatTensor:$grad_output,
                       DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  let results = (outs Dg_FloatTensor:$grad_logits);
  let assemblyFormat = [{
    $logits `,` $targets (`bonus` `(` $bonus_ids^ `,` $bonus `)`)? `,` $grad_output attr-dict `:`
    functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Optimizer
//===----------------------------------------------------------------------===//

def Dg_AdamwOp : Dg_ComputeOp<"adamw", [Pure,
    AllTypesMatch<["param", "grad", "exp_avg", "exp_avg_sq", "new_param", "new_exp_avg", "new_exp_avg_sq"]>,
    AllTypesMatch<["grad_scale", "lr", "bias_correction1", "bias_correction2"]>]> {
  let summary = "One AdamW update of a parameter and its moments (docs/training.md, 'AdamW and clipping'), fused";
  let description = [{
    With g = grad * grad_scale (the accumulation mean and the global-norm clip, one scalar):
    m' = β1 m + (1 − β1) g;  v' = β2 v + (1 − β2) g²;
    p' = p − lr ((m' / bias_correction1) / (sqrt(v' / bias_correction2) + epsilon) + weight_decay p).
    One pass over the four tensors instead of a chain of elementwise ops; the results are written
    back with dg.assign. param, grad, exp_avg, exp_avg_sq and the results share one type; the four
    scalars are rank 0 of its element type.
  }];
  let arguments = (ins Dg_FloatTensor:$param, Dg_FloatTensor:$grad, Dg_FloatTensor:$exp_avg,
                       Dg_FloatTensor:$exp_avg_sq, Dg_FloatTensor:$grad_scale, Dg_FloatTensor:$lr,
                       Dg_FloatTensor:$bias_correction1, Dg_FloatTensor:$bias_correction2,
                       F64Attr:$beta1, F64Attr:$beta2, F64Attr:$epsilon, F64Attr:$weight_decay);
  let results = (outs Dg_FloatTensor:$new_param, Dg_FloatTensor:$new_exp_avg, Dg_FloatTensor:$new_exp_avg_sq);
  let assemblyFormat = [{
    $param `,` $grad `,` $exp_avg `,` $exp_avg_sq `,` $grad_scale `,` $lr `,` $bias_correction1 `,`
    $bias_correction2 attr-dict `:` type($param) `,` type($lr)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Randomness
//===----------------------------------------------------------------------===//

def Dg_RandomUniformOp : Dg_ComputeOp<"random_uniform",
    [Pure, DeclareOpInterfaceMethods<Dg_RandomOpInterface>]> {
  let summary = "Counter-based uniform [0, 1) numbers from an explicit key";
  let description = [{
    The key is `tensor<2xi64>` (seed, offset), one stream for the whole result, or `tensor<Nx2xi64>`:
    row n of the `[N, ...]` result is then drawn from key[n] with element indices counted from 0
    within the row, so a sample's numbers do not depend on its position in the batch
    (docs/kernels.md, "Random numbers").
  }];
  let arguments = (ins Dg_KeyTensor:$key, I64Attr:$stream);
  let results = (outs RankedTensorOf<[F32]>:$result);
  let assemblyFormat = "$key `stream` `=` $stream attr-dict `:` type($key) `->` type($result)";
  let hasVerifier = 1;
}

def Dg_RandomIntOp : Dg_ComputeOp<"random_int",
    [Pure, DeclareOpInterfaceMethods<Dg_RandomOpInterface>]> {
  let summary = "Counter-based integers uniform in [0, high) from an explicit key, without modulo bias";
  let description = [{
    Keys as dg.random_uniform. It reads the same Philox words as a dg.random_uniform with the same
    key and stream, so the two share one (key, stream) space: the verifier rejects a pair of them
    that would draw the same numbers. `high` is in [1, 2^32].
  }];
  let arguments = (ins Dg_KeyTensor:$key, I64Attr:$stream, I64Attr:$high);
  let results = (outs RankedTensorOf<[I64]>:$result);
  let assemblyFormat = "$key `stream` `=` $stream `high` `=` $high attr-dict `:` type($key) `->` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Generation
//===----------------------------------------------------------------------===//

def Dg_CanvasSampleOp : Dg_ComputeOp<"canvas_sample", [Pure]> {
  let summary = "The block-diffusion sampler's per-step statistics in one pass over the vocabulary";
  let description = [{
    logits `[B, L, V]` f32, temperature `[B]` f32 (> 0), key `[B, 2]` i64 (seed, offset) -> per row b
    and canvas position l, with `z = cap(logits[b, l, :]) / temperature[b]` (an f32 division), where
    `cap(x) = softcap * tanh(x / softcap)` in f32 when `softcap` > 0 (Gemma's final-logit soft-cap,
    rounded as the div, tanh and mul ops would round it), else `x`:

    - `sampled` `[B, L]` i64: the Gumbel-max draw `argmax_v (z_v + g_v)`, `g = -log(-log u)`, u in
      (0, 1) from the Philox words dg.random_uniform would read for key[b] (stream 0) at element
      `l * V + v`: a categorical draw from softmax(z), stateless, the same id on every backend.
    - `argmax` `[B, L]` i64: the lowest index of the largest z.
    - `entropy` `[B, L]` f32: `-sum p log p` of `p = softmax(z)`, natural log.
    - `scaled` `[B, L, V]` f32 or bf16: z rounded once to the element type (the self-conditioning
      input of the next denoising step).

    Fused and streamed over V (docs/kernels.md, "canvas_sample"): no `[B, L, V]` f32 temporaries
    besides `scaled`, the soft-capped logits included. The draw is discrete, so there is no
    derivative; no dimension may be sharded.
  }];
  let arguments = (ins RankedTensorOf<[F32]>:$logits, RankedTensorOf<[F32]>:$temperature, Dg_KeyTensor:$key,
                       DefaultValuedAttr<F64Attr, "0.0">:$softcap);
  let results = (outs RankedTensorOf<[I64]>:$sampled, RankedTensorOf<[I64]>:$argmax,
                      RankedTensorOf<[F32]>:$entropy, RankedTensorOf<[F32, BF16]>:$scaled);
  let assemblyFormat = [{
    $logits `,` $temperature `,` $key attr-dict `:` type($logits) `,` type($temperature) `,` type($key) `->`
    type($sampled) `,` type($argmax) `,` type($entropy) `,` type($scaled)
  }];
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Collectives (explicit after partitioning; the group is one axis of the module's dg.mesh)
//===----------------------------------------------------------------------===//

// Every collective states how it shards, what it moves (CommunicationOpInterface) and its
// derivative; the definitions are in DgShardingRules.cpp, DgCost.cpp and DgDerivatives.cpp. They
// read and write memory other ranks see, so no pass may drop, merge or reorder them.
class Dg_CommunicationOp<string mnemonic, list<Trait> traits = []>
    : Dg_Op<mnemonic, !listconcat(traits, [MemoryEffects<[MemRead, MemWrite]>,
        DeclareOpInterfaceMethods<Dg_ShardingRuleOpInterface>,
        DeclareOpInterfaceMethods<Dg_CommunicationOpInterface>,
        DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>])> {
  let hasVerifier = 1;
}

class Dg_CollectiveOp<string mnemonic> : Dg_CommunicationOp<mnemonic> {
  let arguments = (ins Dg_FloatTensor:$input, StrAttr:$axis,
                       DefaultValuedAttr<Dg_ReductionKindAttr, "::mlir::dg::ReductionKind::Sum">:$reduce);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = [{
    $input `axis` `=` $axis (`reduce` `=` `` $reduce^)? attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDefinition = [{
    ::mlir::LogicalResult $cppClass::verify() { return ::mlir::dg::verifyCollectiveOp(*this); }
  }];
}

def Dg_AllReduceOp : Dg_CollectiveOp<"all_reduce"> {
  let summary = "Elementwise reduction (reduce = sum, max or min; sum when omitted) across the axis' ranks";
  let description = [{
    Every rank's result is the reduction of every rank's input. With reduce = sum, the derivative
    (of the sum over the ranks of each rank's loss) is the all-reduced sum of the result cotangent;
    max and min have no derivative rule.
  }];
}
def Dg_AllGatherOp : Dg_CollectiveOp<"all_gather"> {
  let summary = "Concatenation on dim 0 of every rank's input, in rank order";
  let description = [{
    `reduce` must be sum (the default): a gather reduces nothing. It moves bytes, so integer tensors
    (expert routing indices) are gathered too. The derivative is the reduce-scatter (sum) of the
    result cotangent.
  }];
  let arguments = (ins Dg_Tensor:$input, StrAttr:$axis,
                       DefaultValuedAttr<Dg_ReductionKindAttr, "::mlir::dg::ReductionKind::Sum">:$reduce);
  let results = (outs Dg_Tensor:$result);
}
def Dg_ReduceScatterOp : Dg_CollectiveOp<"reduce_scatter"> {
  let summary = "Reduction across ranks, rank r keeping block r of dim 0";
  let description = [{
    The derivative of the sum is the all-gather of the result cotangent; max and min have no
    derivative rule.
  }];
}

def Dg_BroadcastOp : Dg_CommunicationOp<"broadcast", [AllTypesMatch<["input", "result"]>]> {
  let summary = "Every rank's result is the input of rank `root` of the axis";
  let description = [{
    The other ranks' inputs are not read. The derivative is `dg.reduce_to_root` of the result
    cotangent: the root's input influenced every rank's result, the others' inputs nothing.
  }];
  let arguments = (ins Dg_Tensor:$input, StrAttr:$axis, I64Attr:$root);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input `axis` `=` $axis `root` `=` $root attr-dict `:` type($input) `->` type($result)";
}

def Dg_ReduceToRootOp : Dg_CommunicationOp<"reduce_to_root", [AllTypesMatch<["input", "result"]>]> {
  let summary = "The sum of every rank's input on rank `root` of the axis, zeros on the others";
  let description = [{
    The adjoint of `dg.broadcast`, and its derivative rule is a broadcast from the same root. Zeros
    rather than an undefined value on the other ranks keep every rank's program the same dense
    tensor program.
  }];
  let arguments = (ins Dg_FloatTensor:$input, StrAttr:$axis, I64Attr:$root);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = "$input `axis` `=` $axis `root` `=` $root attr-dict `:` type($input) `->` type($result)";
}

def Dg_AllToAllOp : Dg_CommunicationOp<"all_to_all"> {
  let summary = "Ragged all-to-all: rows grouped by destination peer, counts known only at run time";
  let description = [{
    The exchange of expert parallelism's dispatch and combine (docs/parallelism.md, "Expert
    parallelism"). With G the axis size:

    - `input` is `[C_in, ...]`: its first `sum(send_counts)` rows are grouped by destination, peer 0's
      `send_counts[0]` rows first, then peer 1's, and so on; the rows after them are not sent.
    - `send_counts` is `tensor<Gxi64>`, computed at run time; peer p gets `send_counts[p]` rows (this
      rank's own block is a local copy).
    - `result` is `[C_out, ...]` (the same trailing shape and element type): `C_out` is the declared
      capacity, a worst case. Its first `sum(recv_counts)` rows are the received rows grouped by
      source peer in peer order; the rows after them are zero.
    - `recv_counts` is `tensor<Gxi64>`: how many rows each peer sent here (the counts are exchanged
      first).

    A negative count, `sum(send_counts) > C_in` or `sum(recv_counts) > C_out` is a run-time error of
    the step. The derivative is the reverse exchange: the result cotangent sent back with
    `recv_counts` as the send counts, into a buffer of capacity `C_in`; the unsent input rows get zero.
  }];
  let arguments = (ins Dg_Tensor:$input, Dg_KeyTensor:$send_counts, StrAttr:$axis);
  let results = (outs Dg_Tensor:$result, Dg_KeyTensor:$recv_counts);
  let assemblyFormat = [{
    $input `,` $send_counts `axis` `=` $axis attr-dict `:` type($input) `,` type($send_counts) `->`
    type($result) `,` type($recv_counts)
  }];
}

//===----------------------------------------------------------------------===//
// Expert-parallel dispatch (docs/parallelism.md, "Expert parallelism"): the all-to-all form of
// dg.moe_experts that dg-expert-dispatch builds from the all-gather form. Their verifiers, sharding
// rules, costs and derivatives are with every other op's: DgModelOps.cpp, DgShardingRules.cpp,
// DgCost.cpp and DgDerivatives.cpp.
//===----------------------------------------------------------------------===//

def Dg_MoeDispatchOp : Dg_ComputeOp<"moe_dispatch", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Routing table of the expert all-to-all: a slot per (token, j), grouped by destination rank and expert";
  let description = [{
    indices `[N, k]` (global expert ids in [0, num_experts)) over G peers holding E/G experts each
    (global expert e lives on peer e / (E/G) as local expert e % (E/G)). Results:

    - `slots` `[N, k]` i64: the row of route (n, j) among the N·k permuted rows. Rows are grouped by
      global expert, which groups them by destination peer and, within a peer, by local expert;
      within an expert, routes keep (n, j) order. So the permutation depends on the indices alone.
    - `send_counts` `[G]` i64: the routes per destination peer (dg.all_to_all's send counts).
    - `expert_counts` `[G, E/G]` i64: the routes per (destination peer, local expert); row p is what
      peer p's dg.moe_local_experts needs to find its experts' rows among the ones it receives.

    An index outside [0, num_experts) is a run-time error. The routing is discrete: no gradient.
  }];
  let arguments = (ins RankedTensorOf<[I64]>:$indices, I64Attr:$num_experts);
  let results = (outs RankedTensorOf<[I64]>:$slots, RankedTensorOf<[I64]>:$send_counts,
                      RankedTensorOf<[I64]>:$expert_counts);
  let assemblyFormat = [{
    $indices `num_experts` `=` $num_experts attr-dict `:` type($indices) `->` type($slots) `,` type($send_counts) `,`
    type($expert_counts)
  }];
  let hasVerifier = 1;
}

def Dg_MoePermuteOp : Dg_ComputeOp<"moe_permute", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Copies each token's row to its k slots: result[slots[m, j]] = input[m]";
  let description = [{
    input `[M, ...]`, slots `[M, k]` i64 (a permutation of [0, M·k), as dg.moe_dispatch makes it) ->
    `[M·k, ...]` of the input's element type. With M = N·k routes and k = 1 it permutes per-route
    values (the routing weights). Slots that are not a permutation are a run-time error. Its
    derivative is its adjoint, dg.moe_combine without weights.
  }];
  let arguments = (ins Dg_Tensor:$input, RankedTensorOf<[I64]>:$slots);
  let results = (outs Dg_Tensor:$result);
  let assemblyFormat = "$input `,` $slots attr-dict `:` type($input) `,` type($slots) `->` type($result)";
  let hasVerifier = 1;
}

def Dg_MoeCombineOp : Dg_ComputeOp<"moe_combine", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "Unpermute and combine: result[m] = sum_j weights[m, j] * rows[slots[m, j]], summed in f32";
  let description = [{
    rows `[M·k, ...]`, slots `[M, k]` i64 (a permutation of [0, M·k)), optional weights `[M, k]` (the
    rows' element type, or f32 for 16-bit rows; without them every weight is 1) -> `[M, ...]` of the
    rows' type. The sum runs over j in order, in f32 (f64 for f64 rows), and is rounded once: the
    combine of docs/parallelism.md, "Expert parallelism". With k = 1 and no weights it is the
    inverse permutation of dg.moe_permute. Derivative: the rows get dg.moe_permute of the result
    cotangent scaled by each route's weight, the weights the dot product of each route's row with
    its token's cotangent, both computed in the weights' type.
  }];
  let arguments = (ins Dg_FloatTensor:$rows, RankedTensorOf<[I64]>:$slots, Optional<Dg_FloatTensor>:$weights);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = [{
    $rows `,` $slots (`weights` $weights^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Dg_MoeLocalExpertsOp : Dg_ComputeOp<"moe_local_experts", [Pure, DeclareOpInterfaceMethods<Dg_DerivativeOpInterface>]> {
  let summary = "A rank's experts on the rows it received: out[r] = Expert_e(r)(rows[r]), unweighted";
  let description = [{
    rows `[C, H]` as dg.all_to_all received them: grouped by source peer, and within each source by
    local expert, with `expert_counts` `[G, E_l]` i64 (row s: the rows source s sent to each local
    expert) -> `[C, H]`. gate_up `[E_l, 2I, H]` and down `[E_l, H, I]` are the local experts of
    dg.moe_experts. The rows after the `sum(expert_counts)` counted ones are capacity: their outputs
    are zero and cost nothing. Each expert runs one GEMM pair over all its rows. A negative count or
    more counted rows than C is a run-time error. The derivative is dg.moe_local_experts_backward
    with every row's weight 1.
  }];
  let arguments = (ins Dg_FloatTensor:$rows, RankedTensorOf<[I64]>:$expert_counts, Dg_FloatTensor:$gate_up,
                       Dg_FloatTensor:$down);
  let results = (outs Dg_FloatTensor:$result);
  let assemblyFormat = [{
    $rows `,` $expert_counts `,` $gate_up `,` $down attr-dict `:` type($rows) `,` type($expert_counts) `,`
    type($gate_up) `,` type($down) `->` type($result)
  }];
  let hasVerifier = 1;
}

def Dg_MoeLocalExpertsBackwardOp : Dg_ComputeOp<"moe_local_experts_backward", [Pure, AttrSizedResultSegments]> {
  let summary = "Gradients of the received rows' experts, each row weighted by its routing weight";
  let description = [{
    The rows, counts and weights of dg.moe_local_experts, plus `weights` `[C]` (each row's routing
    weight) and `grad_output` `[C, H]` (the gradient of the combined output at the row's token) ->
    grad_rows `[C, H]` = w · J_e(rows)ᵀ grad_output, grad_weights `[C]` = grad_output · Expert_e(rows),
    and the local experts' grad_gate_up and grad_down (f32 allowed for 16-bit weights). Per row this
    is dg.moe_experts_backward's arithmetic for one route; uncounted rows get zero gradients and add
    nothing. grad_gate_up and grad_down are optional, as dg.moe_experts_backward's: a frozen base's
    are neither computed nor stored.
  }];
  let arguments = (ins Dg_FloatTensor:$rows, Dg_FloatTensor:$weights, Dg_FloatTensor:$grad_output,
                       RankedTensorOf<[I64]>:$expert_counts, Dg_FloatTensor:$gate_up, Dg_FloatTensor:$down);
  let results = (outs Dg_FloatTensor:$grad_rows, Dg_FloatTensor:$grad_weights,
                      Optional<Dg_FloatTensor>:$grad_gate_up, Optional<Dg_FloatTensor>:$grad_down);
  let assemblyFormat = [{
    $rows `,` $weights `,` $grad_output `,` $expert_counts `,` $gate_up `,` $down attr-dict `:` type($rows) `,`
    type($weights) `,` type($grad_output) `,` type($expert_counts) `,` type($gate_up) `,` type($down) `->`
    type($grad_rows) `,` type($grad_weights) (`grad_gate_up` type($grad_gate_up)^)? (`grad_down` type($grad_down)^)?
  }];
  let hasVerifier = 1;
  let hasCanonicalizer = 1;
}

#endif // DG_OPS_TD
