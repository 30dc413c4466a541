#ifndef DG_INTERFACES_TD
#define DG_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Dg_DerivativeOpInterface : OpInterface<"DerivativeOpInterface"> {
  let cppNamespace = "::mlir::dg";
  let description = [{
    Reverse-mode derivative of an op: given the cotangent of each result, build (at the builder's
    insertion point) the cotangent of each operand. Reverse-mode autodiff calls this on the forward
    ops in reverse order. An op that does not implement the interface has no derivative, and
    differentiating through it is an error that names it.
  }];
  let methods = [
    InterfaceMethod<[{
        Appends one value per operand to `operandCotangents`: the operand's cotangent, or a null
        Value where the operand receives no gradient (integer ids, random keys). A result with a
        float type always gets a cotangent (zeros when nothing depends on it); an integer result
        (e.g. router indices) gets a null Value.
      }],
      "::mlir::LogicalResult", "buildVjp",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::ArrayRef<::mlir::Value>":$resultCotangents,
           "::llvm::SmallVectorImpl<::mlir::Value> &":$operandCotangents)>,
  ];
}

def Dg_ShardingRuleOpInterface : OpInterface<"ShardingRuleOpInterface"> {
  let cppNamespace = "::mlir::dg";
  let description = [{
    Factor-based sharding rule (the idea of Shardy's OpShardingRule, see #dg.sharding_rule): every
    operand and result dimension is a list of factors, major to minor. A pass-through factor can be
    split the same way everywhere it appears; a reduction factor can be split on the operands,
    leaving the results that lack it partial (a pending sum or max that a collective resolves); a
    need-replication factor must be whole on every rank.
  }];
  let methods = [
    InterfaceMethod<"Returns the op's sharding rule, for its current operand and result types.",
                    "::mlir::dg::ShardingRuleAttr", "getShardingRule", (ins)>,
  ];
}

def Dg_RandomOpInterface : OpInterface<"RandomOpInterface"> {
  let cppNamespace = "::mlir::dg";
  let description = [{
    Random ops are pure functions of an explicit key operand (counter-based Philox, see
    docs/kernels.md): the same key, stream and shape give the same numbers, so CSE, recomputation and
    resharding cannot change results, and resume reproduces them. The (key value, stream) pair of
    each random op in a function must be unique; the verifier rejects two ops drawing the same
    numbers by accident.
  }];
  let methods = [
    InterfaceMethod<"The key operand (tensor<2xi64> or tensor<Nx2xi64>: seed, offset per row).",
                    "::mlir::Value", "getRandomKey", (ins)>,
    InterfaceMethod<"The counter stream this op draws from.", "int64_t", "getStreamId", (ins)>,
  ];
}

def Dg_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::dg";
  let description = [{
    Floating-point operations an op performs (multiply-add counts as 2), for reports and the
    scheduler. Ops without it count as zero FLOPs (data movement).
  }];
  let methods = [
    InterfaceMethod<"FLOPs of one execution.", "int64_t", "getFlops", (ins)>,
  ];
}

def Dg_CommunicationOpInterface : OpInterface<"CommunicationOpInterface"> {
  let cppNamespace = "::mlir::dg";
  let description = [{
    Bytes a collective moves, for reports and the scheduler: what one rank receives from the other
    ranks of its group, counting the ring algorithms NCCL and Gloo use (docs/kernels.md,
    "Collective steps"). A group of one moves nothing. For a ragged exchange, whose counts are known
    only at run time, it is the worst case the op's static capacity allows.
  }];
  let methods = [
    InterfaceMethod<"Bytes one rank receives in one execution.", "int64_t", "getCommunicationBytes", (ins)>,
  ];
}

#endif // DG_INTERFACES_TD
