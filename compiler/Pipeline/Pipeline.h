// The pass pipeline dgemma-compile runs, in the stages that `--emit` can stop at.
#ifndef COMPILER_PIPELINE_PIPELINE_H
#define COMPILER_PIPELINE_PIPELINE_H

#include <string>

#include "mlir/IR/BuiltinOps.h"

namespace mlir::dg {

struct PipelineOptions {
  bool train = false;             // differentiate the loss (mode train)
  std::string lossName = "loss";  // the dg.output to differentiate
};

// Stage "autodiff": simplify, then (train) reverse-mode autodiff and simplify again.
LogicalResult runDifferentiationStage(ModuleOp module, const PipelineOptions& options);
// Stage "plan": the lowering-ready module (simplified, memory planned).
LogicalResult runPlanningStage(ModuleOp module, const PipelineOptions& options);

}  // namespace mlir::dg

#endif
