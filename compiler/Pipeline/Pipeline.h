// The pass pipeline dgemma-compile runs, in the stages that `--emit` can stop at. The phases to come
// slot in between (docs/architecture.md): sharding after differentiation, recomputation and fusion
// before planning.
#ifndef COMPILER_PIPELINE_PIPELINE_H
#define COMPILER_PIPELINE_PIPELINE_H

#include <optional>
#include <string>

#include "mlir/IR/BuiltinOps.h"
#include "plan/OptimizerSettings.h"

namespace mlir::dg {

struct PipelineOptions {
  bool train = false;             // differentiate the loss (mode train)
  std::string lossName = "loss";  // the dg.output to differentiate
  std::optional<dgemma::OptimizerSettings> optimizer;  // train: also add the optimizer_step entry
};

// Stage "autodiff": simplify, then (train) reverse-mode autodiff, the optimizer entry if asked,
// and simplify again.
LogicalResult runDifferentiationStage(ModuleOp module, const PipelineOptions& options);
// Stage "plan": the lowering-ready module (simplified, memory planned).
LogicalResult runPlanningStage(ModuleOp module, const PipelineOptions& options);

// Registers the stages as textual pipelines for dgemma-opt, so that lit can run exactly what
// dgemma-compile runs: --dg-infer-pipeline (simplify), --dg-train-pipeline{loss=... optimizer=...
// beta1=...} (simplify, autodiff, fp32 gradient accumulation, the optimizer entry, simplify) and
// --dg-plan-pipeline (memory planning).
void registerDgemmaPipelines();

}  // namespace mlir::dg

#endif
