#ifndef DG_DIALECT_TD
#define DG_DIALECT_TD

include "mlir/IR/OpBase.td"

def Dg_Dialect : Dialect {
  let name = "dg";
  let cppNamespace = "::mlir::dg";
  let summary = "dgemma's dataflow-graph dialect";
  let description = [{
    Values are builtin ranked tensors. A module holds entry-point functions (`dg.entry`) without
    arguments or results: `dg.param` and `dg.input` bring values in by name, `dg.output` hands them
    out by name. Model-level ops (rms_norm, softmax, attention, MoE, losses) stay whole until late
    passes so that sharding and kernel selection see their structure. The module attribute
    `dg.mesh` (a `#dg.mesh`: named axes in rank order, each with a size and a role) describes the
    device mesh that collectives name.
  }];
  let hasOperationAttrVerify = 1;
  let useDefaultAttributePrinterParser = 1;
  let extraClassDeclaration = [{
    void registerAttributes();
  }];
}

class Dg_Op<string mnemonic, list<Trait> traits = []> : Op<Dg_Dialect, mnemonic, traits>;

#endif // DG_DIALECT_TD
