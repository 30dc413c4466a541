// The attribute names of recomputation (docs/training.md, "Recomputation"), verified by
// DgDialect::verifyOperationAttribute like those of DgDialect.h.
#ifndef DIALECTS_DG_IR_DGRECOMPUTE_H
#define DIALECTS_DG_IR_DGRECOMPUTE_H

#include "llvm/ADT/StringRef.h"

namespace mlir::dg {

// Set by the model builder on the first and the last op of each layer's forward (the input norm and
// the layer-scalar multiply), with the layer's index in its stack: the spans dg-recompute
// recomputes (docs/training.md, "Recomputation"). A span is the ops from a begin to the next end.
inline constexpr llvm::StringLiteral kLayerBeginAttr = "dg.layer_begin";
inline constexpr llvm::StringLiteral kLayerEndAttr = "dg.layer_end";
// Written by dg-recompute on each clone it inserts before the backward (a unit attribute): the
// cost report counts their FLOPs as the recomputation's overhead, and a cloned random op may draw
// the (key, stream) of the op it copies.
inline constexpr llvm::StringLiteral kRecomputedAttr = "dg.recomputed";

}  // namespace mlir::dg

#endif
