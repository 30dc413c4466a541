// The pass pipeline dgemma-compile runs, in the stages that `--emit` can stop at: differentiation,
// sharding (whole program, then one partition per rank), recomputation, planning (elementwise fusion
// and the backward schedule included; docs/architecture.md, "From config to plan to runtime"). The
// passes that work on one entry point at a time are function passes, nested under the module.
#ifndef COMPILER_PIPELINE_PIPELINE_H
#define COMPILER_PIPELINE_PIPELINE_H

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/Transforms/MemoryPlan.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "compiler/Transforms/RecomputePolicy.h"
#include "plan/OptimizerSettings.h"

namespace mlir::dg {

// CPU seconds (the process's, std::clock) per pass name, summed over every stage and rank that ran
// it (dgemma-compile --report).
struct PassTimes {
  std::map<std::string, double> seconds;
  std::map<std::string, int64_t> runs;
};

// Low-rank adapters over a frozen base (dg-lora; docs/training.md, "LoRA adapters").
struct LoraOptions {
  int64_t rank = 8;
  double alpha = 8;
  std::vector<std::string> targets;
  double dropout = 0;
  std::string dropoutKeys;  // the entry input whose keys draw the dropout masks
  std::vector<std::string> dropoutEntries;  // the entries that train with dropout
};

struct PipelineOptions {
  bool train = false;             // differentiate the loss (mode train)
  std::string lossName = "loss";  // the dg.output to differentiate
  std::optional<dgemma::OptimizerSettings> optimizer;  // train: also add the optimizer_step entry
  std::optional<LoraOptions> lora;  // freeze the weights and add adapters before anything else
  RecomputePolicy recompute;      // train: what the backward recomputes (dg-recompute)
  bool scheduleBackward = true;   // train: dg-backward-schedule before planning (false: autodiff's order)
  bool fusion = true;             // dg-fuse-elementwise before memory planning
  // The frozen base's storage (dg-base-dtype, before autodiff): f32 leaves it as built; bf16, int8 or nf4
  // converts the dg.frozen_base parameters (docs/training.md, "Frozen low-precision base").
  std::string baseDtype = "f32";
  // When set, every stage adds its passes' times. The function passes would run side by side on a
  // multithreaded context, each timed with the others' CPU, so the context must be single-threaded
  // (MLIRContext::disableMultithreading).
  PassTimes* passTimes = nullptr;
  // When set, the planning stage hands it each entry's numbers; called from dg-memory-plan, so from
  // several threads at once unless the context is single-threaded.
  MemoryPlanObserver memoryPlanObserver;
};

// Stage "autodiff": adapters (dg-lora) when asked, simplify, then (train) reverse-mode autodiff, the optimizer entry if asked,
// and simplify again.
LogicalResult runDifferentiationStage(ModuleOp module, const PipelineOptions& options);
// Stage "recompute", on one rank's program: dg-recompute with the options' policy (none: nothing).
LogicalResult runRecomputationStage(ModuleOp module, const PipelineOptions& options);
// Stage "plan": the lowering-ready module (elementwise chains fused unless options.fusion is off,
// memory planned).
LogicalResult runPlanningStage(ModuleOp module, const PipelineOptions& options);

// A parallel layout for the sharding stage (docs/parallelism.md): world = TP x DP = EDP x EP.
struct ShardingOptions {
  int64_t tensorParallel = 1;
  int64_t dataParallel = 1;
  int64_t expertParallel = 1;
  bool sequenceParallel = false;
  bool distributedOptimizer = true;  // ZeRO-1: optimizer state sharded over the data-parallel ranks
  // Expert parallelism's token exchange: the all-gather form the partitioner builds (false), or
  // dg-expert-dispatch's all-to-all dispatch (true). docs/parallelism.md, "Expert parallelism".
  bool expertAllToAll = false;
  PassTimes* passTimes = nullptr;    // when set, the sharding stage and the partitions add their passes' times
  // Context parallelism: the encoder's sequence split over this many ranks (docs/parallelism.md,
  // "Context parallelism"); world = CP x TP x DP.
  int64_t contextParallel = 1;

  int64_t worldSize() const { return contextParallel * tensorParallel * dataParallel; }
};

// Stage "sharded", on the whole program: the layout's mesh, the parameters' and inputs' shardings
// (dg-shard-annotate) and every value's (dg-shard-propagate). Every rank's program comes from this one
// annotated module.
LogicalResult runShardingStage(ModuleOp module, const ShardingOptions& options);
// Rank `rank`'s program: a copy of the annotated module partitioned for that rank (dg-shard-partition),
// with the expert all-gathers turned into all-to-all dispatch (dg-expert-dispatch) when the options
// ask for it.
FailureOr<OwningOpRef<ModuleOp>> partitionForRank(ModuleOp annotated, int64_t rank, const ShardingOptions& options);

// Registers the stages as textual pipelines for dgemma-opt, so that lit can run exactly what
// dgemma-compile runs: --dg-infer-pipeline (simplify), --dg-train-pipeline{loss=... optimizer=...
// beta1=...} (simplify, autodiff, fp32 gradient accumulation, the optimizer entry, simplify) and
// --dg-plan-pipeline{recompute=none|full|full:N|selective fusion=true|false} (recomputation, elementwise
// fusion when asked: dgemma-compile's default, memory planning).
void registerDgemmaPipelines();

}  // namespace mlir::dg

#endif
