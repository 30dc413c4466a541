#ifndef COMPILER_TRANSFORMS_PASSES_H
#define COMPILER_TRANSFORMS_PASSES_H

#include "dialects/dg/IR/DgOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::dg {

#define GEN_PASS_DECL
#include "compiler/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "compiler/Transforms/Passes.h.inc"

}  // namespace mlir::dg

#endif
