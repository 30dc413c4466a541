#include "compiler/Pipeline/Pipeline.h"

#include <ctime>
#include <vector>

#include "compiler/Transforms/Passes.h"
#include "mlir/Pass/PassManager.h"
#include "mlir/Pass/PassRegistry.h"
#include "mlir/Transforms/Passes.h"

namespace mlir::dg {

namespace {

void addSimplification(OpPassManager& passes) {
  passes.addPass(createCanonicalizerPass());
  passes.addPass(createCSEPass());
}

void addDifferentiationStage(OpPassManager& passes, const PipelineOptions& options) {
  addSimplification(passes);
  if (!options.train) return;
  passes.addPass(createDgAutodiff(DgAutodiffOptions{options.lossName}));
  passes.addPass(createDgF32GradientAccumulation());
  if (const std::optional<dgemma::OptimizerSettings>& adam = options.optimizer) {
    passes.addPass(createDgOptimizerStep(
        DgOptimizerStepOptions{adam->beta1, adam->beta2, adam->epsilon, adam->weightDecay, adam->maxGradNorm}));
    // The gradients feed the optimizer through device buffers; without an optimizer they stay outputs.
    passes.addPass(createDgGradientBuffers());
  }
  addSimplification(passes);
}

void addRecomputationStage(OpPassManager& passes, const RecomputePolicy& policy) {
  if (policy.kind != RecomputePolicy::Kind::None) passes.addPass(createDgRecompute(DgRecomputeOptions{policy.name()}));
}

void addPlanningStage(OpPassManager& passes, const PipelineOptions& options) {
  // After dg-recompute: a recomputed clone of the experts hands its backward the pre-activations.
  passes.addPass(createDgKeepExpertActivations());
  if (options.scheduleBackward) passes.addPass(createDgBackwardSchedule(DgBackwardScheduleOptions{options.lossName}));
  // After the schedule: fusion groups runs of ops that are contiguous in the final order.
  if (options.fusion) passes.addPass(createDgFuseElementwise());
  if (options.memoryPlanObserver) passes.addPass(createDgMemoryPlanObserved(options.memoryPlanObserver));
  else passes.addPass(createDgMemoryPlan());
}

// The textual form of the plan stage's options: the recomputation that comes before planning.
struct PlanPipelineOptions : public PassPipelineOptions<PlanPipelineOptions> {
  Option<std::string> recompute{*this, "recompute", llvm::cl::desc("dg-recompute's policy: none | full | full:N | selective"),
                                llvm::cl::init("none")};
  Option<bool> fusion{*this, "fusion", llvm::cl::desc("dg-fuse-elementwise before planning (dgemma-compile --fusion on)"),
                      llvm::cl::init(false)};
};

// Adds each pass's CPU time (the process's, so every thread's and none of another process's on a
// loaded machine) to a PassTimes.
class PassTimer : public PassInstrumentation {
 public:
  explicit PassTimer(PassTimes& times) : times_(times) {}
  void runBeforePass(Pass*, Operation*) override { starts_.push_back(std::clock()); }
  void runAfterPass(Pass* pass, Operation*) override { stop(pass); }
  void runAfterPassFailed(Pass* pass, Operation*) override { stop(pass); }

 private:
  void stop(Pass* pass) {
    const double elapsed = double(std::clock() - starts_.back()) / CLOCKS_PER_SEC;
    starts_.pop_back();
    std::string name = pass->getArgument().empty() ? pass->getName().str() : pass->getArgument().str();
    times_.seconds[name] += elapsed;
    ++times_.runs[name];
  }
  PassTimes& times_;
  std::vector<std::clock_t> starts_;
};

void timePasses(PassManager& passes, PassTimes* times) {
  if (times) passes.addInstrumentation(std::make_unique<PassTimer>(*times));
}

// The textual form of the train stage's options (defaults: the 26B recipe).
struct TrainPipelineOptions : public PassPipelineOptions<TrainPipelineOptions> {
  Option<std::string> loss{*this, "loss", llvm::cl::desc("Name of the dg.output to differentiate"),
                           llvm::cl::init("loss")};
  Option<bool> optimizer{*this, "optimizer", llvm::cl::desc("Add the optimizer_step entry"), llvm::cl::init(true)};
  Option<double> beta1{*this, "beta1", llvm::cl::desc("Adam β1"), llvm::cl::init(dgemma::OptimizerSettings{}.beta1)};
  Option<double> beta2{*this, "beta2", llvm::cl::desc("Adam β2"), llvm::cl::init(dgemma::OptimizerSettings{}.beta2)};
  Option<double> epsilon{*this, "epsilon", llvm::cl::desc("Adam ε"), llvm::cl::init(dgemma::OptimizerSettings{}.epsilon)};
  Option<double> weightDecay{*this, "weight-decay", llvm::cl::desc("decoupled weight decay"),
                             llvm::cl::init(dgemma::OptimizerSettings{}.weightDecay)};
  Option<double> maxGradNorm{*this, "max-grad-norm", llvm::cl::desc("global-norm clip"),
                             llvm::cl::init(dgemma::OptimizerSettings{}.maxGradNorm)};

  PipelineOptions toPipelineOptions() const {
    PipelineOptions options;
    options.train = true;
    options.lossName = loss;
    if (optimizer) options.optimizer = dgemma::OptimizerSettings{beta1, beta2, epsilon, weightDecay, maxGradNorm};
    return options;
  }
};

}  // namespace

LogicalResult runDifferentiationStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  timePasses(passes, options.passTimes);
  addDifferentiationStage(passes, options);
  return passes.run(module);
}

LogicalResult runRecomputationStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  timePasses(passes, options.passTimes);
  addRecomputationStage(passes, options.recompute);
  return passes.run(module);
}

LogicalResult runPlanningStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  timePasses(passes, options.passTimes);
  addPlanningStage(passes, options);
  return passes.run(module);
}

LogicalResult runShardingStage(ModuleOp module, const ShardingOptions& options) {
  PassManager passes(module.getContext());
  timePasses(passes, options.passTimes);
  passes.addPass(createDgShardAnnotate(DgShardAnnotateOptions{options.tensorParallel, options.dataParallel,
                                                              options.expertParallel, options.sequenceParallel,
                                                              options.distributedOptimizer}));
  passes.addPass(createDgShardPropagate(DgShardPropagateOptions{options.sequenceParallel}));
  return passes.run(module);
}

FailureOr<OwningOpRef<ModuleOp>> partitionForRank(ModuleOp annotated, int64_t rank, const ShardingOptions& options) {
  OwningOpRef<ModuleOp> program(annotated.clone());
  PassManager passes(annotated.getContext());
  timePasses(passes, options.passTimes);
  passes.addPass(createDgShardPartition(DgShardPartitionOptions{rank}));
  if (options.expertAllToAll) passes.addPass(createDgExpertDispatch());
  if (failed(passes.run(*program))) return failure();
  return program;
}

void registerDgemmaPipelines() {
  PassPipelineRegistration<>("dg-infer-pipeline", "dgemma-compile's differentiation stage in mode infer (simplify)",
                             [](OpPassManager& passes) { addDifferentiationStage(passes, PipelineOptions{}); });
  PassPipelineRegistration<TrainPipelineOptions>(
      "dg-train-pipeline",
      "dgemma-compile's differentiation stage in mode train: simplify, dg-autodiff, dg-f32-gradient-accumulation, "
      "dg-optimizer-step, dg-gradient-buffers, simplify",
      [](OpPassManager& passes, const TrainPipelineOptions& options) {
        addDifferentiationStage(passes, options.toPipelineOptions());
      });
  PassPipelineRegistration<PlanPipelineOptions>(
      "dg-plan-pipeline",
      "dgemma-compile's recomputation and planning stages (dg-recompute unless none, dg-keep-expert-activations, "
      "dg-backward-schedule, "
      "dg-fuse-elementwise when fusion=true, dg-memory-plan)",
      [](OpPassManager& passes, const PlanPipelineOptions& options) {
        // A policy the parser refuses goes to dg-recompute as written, which reports it.
        if (options.recompute != "none") passes.addPass(createDgRecompute(DgRecomputeOptions{options.recompute}));
        PipelineOptions planning;
        planning.fusion = options.fusion;
        addPlanningStage(passes, planning);
      });
}

}  // namespace mlir::dg
