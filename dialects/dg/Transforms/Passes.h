#ifndef DIALECTS_DG_TRANSFORMS_PASSES_H
#define DIALECTS_DG_TRANSFORMS_PASSES_H

#include "dialects/dg/IR/DgOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::dg {

#define GEN_PASS_DECL
#include "dialects/dg/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "dialects/dg/Transforms/Passes.h.inc"

}  // namespace mlir::dg

#endif
