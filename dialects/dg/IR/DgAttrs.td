#ifndef DG_ATTRS_TD
#define DG_ATTRS_TD

include "dialects/dg/IR/DgDialect.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

//===----------------------------------------------------------------------===//
// Enums. Each prints as its bare keyword inside an op's assembly (`mask = causal`); the plan
// lowering writes the same keyword as the step attribute's string, which the runtime reads.
//===----------------------------------------------------------------------===//

def Dg_AttentionMask : I32EnumAttr<"AttentionMask", "which keys each query of dg.attention sees", [
    I32EnumAttrCase<"Causal", 0, "causal">,
    I32EnumAttrCase<"Bidirectional", 1, "bidirectional">,
    I32EnumAttrCase<"Prefix", 2, "prefix">,
  ]> {
  let cppNamespace = "::mlir::dg";
  let genSpecializedAttr = 0;
}
def Dg_AttentionMaskAttr : EnumAttr<Dg_Dialect, Dg_AttentionMask, "mask">;

def Dg_ComparePredicate : I32EnumAttr<"ComparePredicate", "the comparison dg.compare makes", [
    I32EnumAttrCase<"Lt", 0, "lt">,
    I32EnumAttrCase<"Le", 1, "le">,
    I32EnumAttrCase<"Gt", 2, "gt">,
    I32EnumAttrCase<"Ge", 3, "ge">,
    I32EnumAttrCase<"Eq", 4, "eq">,
    I32EnumAttrCase<"Ne", 5, "ne">,
  ]> {
  let cppNamespace = "::mlir::dg";
  let genSpecializedAttr = 0;
}
def Dg_ComparePredicateAttr : EnumAttr<Dg_Dialect, Dg_ComparePredicate, "predicate">;

def Dg_ReductionKind : I32EnumAttr<"ReductionKind", "how a collective combines the ranks' values", [
    I32EnumAttrCase<"Sum", 0, "sum">,
    I32EnumAttrCase<"Max", 1, "max">,
    I32EnumAttrCase<"Min", 2, "min">,
  ]> {
  let cppNamespace = "::mlir::dg";
  let genSpecializedAttr = 0;
}
def Dg_ReductionKindAttr : EnumAttr<Dg_Dialect, Dg_ReductionKind, "reduction">;

//===----------------------------------------------------------------------===//
// Sharding rules
//===----------------------------------------------------------------------===//

def Dg_FactorKind : I32EnumAttr<"FactorKind", "how a sharding-rule factor may be split", [
    // Split the same way on every tensor it appears in.
    I32EnumAttrCase<"PassThrough", 0, "pass_through">,
    // Split on the operands; the results that lack it become partial (a pending sum or max).
    I32EnumAttrCase<"Reduction", 1, "reduction">,
    // Must be whole on every rank (a softmax or norm axis, a gathered table's rows).
    I32EnumAttrCase<"NeedReplication", 2, "need_replication">,
  ]> {
  let cppNamespace = "::mlir::dg";
  let genSpecializedAttr = 0;
}

def Dg_TensorFactorsAttr : AttrDef<Dg_Dialect, "TensorFactors"> {
  let summary = "The factors of each dimension of one operand or result of a sharding rule";
  let description = [{
    One factor-index list per dimension, major to minor: the dimension's size is the product of its
    factors' sizes, and an empty list is a size-1 dimension that broadcasts. Inside
    `#dg.sharding_rule` it is written with factor names; on its own (only ever for debugging) as the
    index lists: `#dg.tensor_factors<[[0], [], [1, 2]]>`.
  }];
  let mnemonic = "tensor_factors";
  let parameters = (ins OptionalArrayRefParameter<"::mlir::DenseI64ArrayAttr", "factor indices per dimension">:$dims);
  let assemblyFormat = "`<` (`[` $dims^ `]`)? `>`";
  let extraClassDeclaration = [{
    int64_t getRank() const { return getDims().size(); }
    ::llvm::ArrayRef<int64_t> getDimFactors(int64_t dim) const { return getDims()[dim].asArrayRef(); }
  }];
}

def Dg_ShardingRuleAttr : AttrDef<Dg_Dialect, "ShardingRule"> {
  let mnemonic = "sharding_rule";
  let summary = "Factor-based sharding rule of an op (the idea of Shardy's OpShardingRule)";
  let description = [{
    Every operand and result dimension is a list of factors, major to minor; a factor has a size and
    a kind (`FactorKind`). Splitting a factor n ways splits every dimension it appears in
    consistently, so `[(k g)]` for attention's query heads and `[k]` for its KV heads say that
    splitting the KV heads splits the query heads with them. A minor factor can only be split as a
    block of its dimension when the factors before it are split completely.

        #dg.sharding_rule<([i, j, l], [l, k]) -> ([i, j, k]) {i = 2, j = 4, k = 16, l = 8} reduction = {l}>

    Factors are named by letters in order of their sizes' list (i, j, ..., z, then f18, f19, ...);
    `(j k)` is a dimension of two factors, `1` a size-1 dimension without one. The kinds follow the
    sizes: `reduction = {...}` and `need_replication = {...}`, every other factor is pass-through.
  }];
  let parameters = (ins ArrayRefParameter<"int64_t", "factor sizes">:$factorSizes,
                        ArrayRefParameter<"::mlir::dg::FactorKind", "factor kinds">:$factorKinds,
                        ArrayRefParameter<"::mlir::dg::TensorFactorsAttr", "per operand">:$operands,
                        ArrayRefParameter<"::mlir::dg::TensorFactorsAttr", "per result">:$results);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    int64_t getNumFactors() const { return getFactorSizes().size(); }
    // Whether the op's operand and result types have the rule's ranks, and each dimension's size is
    // the product of its factors' sizes; emits an error on the op otherwise.
    ::mlir::LogicalResult verifyShapes(::mlir::Operation* op) const;
  }];
}

//===----------------------------------------------------------------------===//
// The mesh (docs/parallelism.md, "Meshes")
//===----------------------------------------------------------------------===//

def Dg_AxisRole : I32EnumAttr<"AxisRole", "which kind of parallelism a mesh axis carries", [
    // Replicas of the whole model on different batches.
    I32EnumAttrCase<"Data", 0, "data">,
    // Ranks holding different experts (for the dense layers, more data-parallel ranks).
    I32EnumAttrCase<"Expert", 1, "expert">,
    // Ranks holding different heads, columns or rows of the same layer.
    I32EnumAttrCase<"Tensor", 2, "tensor">,
    // Ranks holding different parts of the sequence.
    I32EnumAttrCase<"Context", 3, "context">,
  ]> {
  let cppNamespace = "::mlir::dg";
  let genSpecializedAttr = 0;
}

def Dg_MeshAxisAttr : AttrDef<Dg_Dialect, "MeshAxis"> {
  let mnemonic = "mesh_axis";
  let summary = "One axis of a #dg.mesh: its name, its size and the parallelism it carries";
  let description = [{
    Inside `#dg.mesh` it is written `name = size (role)`; on its own (only ever for debugging) as
    `#dg.mesh_axis<"tp", 2, tensor>`.
  }];
  let parameters = (ins StringRefParameter<"axis name">:$name, "int64_t":$size,
                        EnumParameter<Dg_AxisRole>:$role);
  let assemblyFormat = "`<` $name `,` $size `,` $role `>`";
}

def Dg_MeshAttr : AttrDef<Dg_Dialect, "Mesh"> {
  let mnemonic = "mesh";
  let summary = "The module's device mesh: named axes in rank order, each with a size and a role";
  let description = [{
    The ranks are numbered row-major over the axes in the order listed, the last axis fastest; a
    rank's coordinate on an axis selects its block of every tensor split over that axis. Passes find
    axes by their role, never by their name.

        #dg.mesh<[dp = 2 (data), ep = 2 (expert), tp = 2 (tensor)]>
        #dg.mesh<[]>                                   // one rank
  }];
  let parameters = (ins OptionalArrayRefParameter<"::mlir::dg::MeshAxisAttr", "axes, major to minor">:$axes);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

//===----------------------------------------------------------------------===//
// Shardings (docs/parallelism.md, "How the passes shard")
//===----------------------------------------------------------------------===//

def Dg_ShardingAttr : AttrDef<Dg_Dialect, "Sharding"> {
  let mnemonic = "sharding";
  let summary = "How one tensor is laid out over the module's dg.mesh axes";
  let description = [{
    One list of mesh axes per dimension, major to minor: a dimension split over axes of total size
    n holds, on each rank, the contiguous block that the rank's coordinates on those axes select
    (row-major over the listed axes). `partial` lists the axes over which every rank's value is a
    pending sum: the tensor is the sum of the ranks' values along them. An axis is used at most
    once per sharding.

        #dg.sharding<[[dp], [], [ep, tp]]>            // dim 0 over dp, dim 2 over ep then tp
        #dg.sharding<[[], []], partial = [tp]>        // whole shape, a sum over tp pending
        #dg.sharding<[]>                              // a replicated scalar
  }];
  let parameters = (ins OptionalArrayRefParameter<"::mlir::ArrayAttr", "mesh axes per dimension">:$dims,
                        OptionalArrayRefParameter<"::mlir::StringAttr", "axes of a pending sum">:$partial);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    static ShardingAttr replicated(::mlir::MLIRContext* context, int64_t rank);
    static ShardingAttr get(::mlir::MLIRContext* context, ::llvm::ArrayRef<::llvm::SmallVector<::llvm::StringRef>> dims,
                            ::llvm::ArrayRef<::llvm::StringRef> partial = {});
    int64_t getRank() const { return getDims().size(); }
    // The axes dimension `dim` is split over, major to minor.
    ::llvm::SmallVector<::llvm::StringRef> getDimAxes(int64_t dim) const;
    ::llvm::SmallVector<::llvm::StringRef> getPartialAxes() const;
    // Every axis the sharding uses, on a dimension or as a pending sum.
    ::llvm::SmallVector<::llvm::StringRef> getUsedAxes() const;
    bool isReplicated() const;  // no split dimension and no pending sum
  }];
}

#endif // DG_ATTRS_TD
