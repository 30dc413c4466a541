#include "compiler/Pipeline/Pipeline.h"

#include <ctime>
#include <set>
#include <utility>
#include <vector>

#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
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
  if (const std::optional<LoraOptions>& lora = options.lora) {
    DgLoraOptions adapters{lora->rank,    lora->alpha,       lora->targets,
                           lora->dropout, lora->dropoutKeys, lora->dropoutEntries};
    passes.addPass(createDgLora(adapters));
  }
  // After dg-lora (which marks the frozen base) and before autodiff, so the frozen base's codes are off the active path from the start.
  if (options.baseDtype != "f32") passes.addPass(createDgBaseDtype(DgBaseDtypeOptions{options.baseDtype}));
  addSimplification(passes);
  if (!options.train) return;
  passes.addPass(createDgAutodiff(DgAutodiffOptions{options.lossName}));
  passes.addNestedPass<func::FuncOp>(createDgF32GradientAccumulation());
  if (const std::optional<dgemma::OptimizerSettings>& adam = options.optimizer) {
    passes.addPass(createDgOptimizerStep(
        DgOptimizerStepOptions{adam->beta1, adam->beta2, adam->epsilon, adam->weightDecay, adam->maxGradNorm}));
    // The gradients feed the optimizer through device buffers; without an optimizer they stay outputs.
    passes.addPass(createDgGradientBuffers());
  }
  addSimplification(passes);
}

void addRecomputationStage(OpPassManager& passes, const RecomputePolicy& policy) {
  if (policy.kind != RecomputePolicy::Kind::None)
    passes.addNestedPass<func::FuncOp>(createDgRecompute(DgRecomputeOptions{policy.name()}));
}

// Every planning pass works on one entry point at a time.
void addPlanningStage(OpPassManager& passes, const PipelineOptions& options) {
  OpPassManager& perFunction = passes.nest<func::FuncOp>();
  // After dg-recompute: a recomputed clone of the experts hands its backward the pre-activations.
  perFunction.addPass(createDgKeepExpertActivations());
  if (options.scheduleBackward)
    perFunction.addPass(createDgBackwardSchedule(DgBackwardScheduleOptions{options.lossName}));
  // After the schedule: fusion groups runs of ops that are contiguous in the final order.
  if (options.fusion) perFunction.addPass(createDgFuseElementwise());
  if (options.memoryPlanObserver) perFunction.addPass(createDgMemoryPlanObserved(options.memoryPlanObserver));
  else perFunction.addPass(createDgMemoryPlan());
}

// The textual form of the plan stage's options: the recomputation that comes before planning.
struct PlanPipelineOptions : public PassPipelineOptions<PlanPipelineOptions> {
  Option<std::string> recompute{*this, "recompute", llvm::cl::desc("dg-recompute's policy: none | full | full:N | selective"),
                                llvm::cl::init("none")};
  Option<bool> fusion{*this, "fusion", llvm::cl::desc("dg-fuse-elementwise before planning (dgemma-compile --fusion on)"),
                      llvm::cl::init(false)};
};

// Adds each pass's CPU time (the process's, so every thread's and none of another process's on a
// loaded machine) to a PassTimes. A pass without an argument is a pass manager's adaptor running a
// nested pipeline (the per-function passes): its time is its passes', so it is not counted again.
// One timer serves one pass manager, which runs each function pass once over a module's functions.
class PassTimer : public PassInstrumentation {
 public:
  explicit PassTimer(PassTimes& times) : times_(times) {}
  void runBeforePass(Pass* pass, Operation*) override {
    if (!pass->getArgument().empty()) starts_.push_back(std::clock());
  }
  void runAfterPass(Pass* pass, Operation* op) override { stop(pass, op); }
  void runAfterPassFailed(Pass* pass, Operation* op) override { stop(pass, op); }

 private:
  void stop(Pass* pass, Operation* op) {
    if (pass->getArgument().empty()) return;
    const double elapsed = double(std::clock() - starts_.back()) / CLOCKS_PER_SEC;
    starts_.pop_back();
    const std::string name = pass->getArgument().str();
    times_.seconds[name] += elapsed;
    // A run is one over a program: a function pass's runs on the functions of one module count once.
    if (isa<ModuleOp>(op) || functionPassesRun_.insert({name, op->getParentOfType<ModuleOp>()}).second)
      ++times_.runs[name];
  }
  PassTimes& times_;
  std::vector<std::clock_t> starts_;
  std::set<std::pair<std::string, Operation*>> functionPassesRun_;
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

// A stage's pass manager: its function passes run one entry point at a time, never side by side:
// dg.entry's verifier, which runs after each pass on the function the pass changed, checks that a
// parameter has one type in every entry point, so it reads sibling functions that another thread
// would be rewriting.
void configureStage(PassManager& passes, PassTimes* times) {
  passes.getContext()->disableMultithreading();
  timePasses(passes, times);
}

}  // namespace

LogicalResult runDifferentiationStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  configureStage(passes, options.passTimes);
  addDifferentiationStage(passes, options);
  return passes.run(module);
}

LogicalResult runRecomputationStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  configureStage(passes, options.passTimes);
  addRecomputationStage(passes, options.recompute);
  return passes.run(module);
}

LogicalResult runPlanningStage(ModuleOp module, const PipelineOptions& options) {
  PassManager passes(module.getContext());
  configureStage(passes, options.passTimes);
  addPlanningStage(passes, options);
  return passes.run(module);
}

LogicalResult runShardingStage(ModuleOp module, const ShardingOptions& options) {
  PassManager passes(module.getContext());
  configureStage(passes, options.passTimes);
  passes.addPass(createDgShardAnnotate(DgShardAnnotateOptions{options.tensorParallel, options.dataParallel,
                                                              options.expertParallel, options.sequenceParallel,
                                                              options.distributedOptimizer, options.contextParallel}));
  passes.addPass(createDgShardPropagate(DgShardPropagateOptions{options.sequenceParallel}));
  return passes.run(module);
}

FailureOr<OwningOpRef<ModuleOp>> partitionForRank(ModuleOp annotated, int64_t rank, const ShardingOptions& options) {
  OwningOpRef<ModuleOp> program(annotated.clone());
  PassManager passes(annotated.getContext());
  configureStage(passes, options.passTimes);
  passes.addPass(createDgShardPartition(DgShardPartitionOptions{rank}));
  if (options.expertAllToAll) passes.addNestedPass<func::FuncOp>(createDgExpertDispatch());
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
        if (options.recompute != "none")
          passes.addNestedPass<func::FuncOp>(createDgRecompute(DgRecomputeOptions{options.recompute}));
        PipelineOptions planning;
        planning.fusion = options.fusion;
        addPlanningStage(passes, planning);
      });
}

}  // namespace mlir::dg
