#include "compiler/Pipeline/Pipeline.h"

#include "dialects/dg/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Transforms/Passes.h"

namespace mlir::dg {

namespace {
void addSimplification(PassManager& passes) {
  passes.addPass(createCanonicalizerPass());
  passes.addPass(createCSEPass());
}
}  // namespace

LogicalResult runDifferentiationStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  addSimplification(passes);
  if (options.train) {
    passes.addPass(createDgAutodiff(DgAutodiffOptions{options.lossName}));
    passes.addPass(createDgF32GradientAccumulation());
    if (const std::optional<OptimizerOptions>& adam = options.optimizer)
      passes.addPass(createDgOptimizerStep(
          DgOptimizerStepOptions{adam->beta1, adam->beta2, adam->epsilon, adam->weightDecay, adam->maxGradNorm}));
    addSimplification(passes);
  }
  return passes.run(module);
}

LogicalResult runPlanningStage(ModuleOp module, const PipelineOptions&) {
  PassManager passes(module.getContext());
  passes.addPass(createDgMemoryPlan());
  return passes.run(module);
}

}  // namespace mlir::dg
