// dgemma-compile --report: per entry point the FLOPs and scratch of rank 0's program; per rank the
// peak memory and its pools (parameters, gradient buffers, optimizer state, inference run state,
// constants, activations, communication buffers, workspace), the planner's packings, the FLOPs and
// recompute overhead of one step and its communication, next to the analytic minimum for the
// layout; the time per compiler pass.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "compiler/Driver/CostModel.h"
#include "compiler/Pipeline/Pipeline.h"
#include "compiler/Transforms/MemoryPlan.h"
#include "mlir/IR/BuiltinOps.h"
#include "plan/Plan.h"

// One rank's memory by pool, as the runtime allocates it (the plan's arenas; docs/performance.md),
// and its work per step. A plain struct for the layout search: rankReport fills it from a rank's
// planned program and its plan, and peakBytes() is what the rank needs on its device.
struct RankReport {
  int64_t rank = 0;
  uint64_t parameterBytes = 0;  // the model's parameters (f32 masters)
  uint64_t gradientBytes = 0;   // grad/ buffers
  uint64_t optimizerBytes = 0;  // optimizer/ state (AdamW moments)
  // The model's parameters split by whether they train (all of them, or the adapters under --lora):
  // elements of the whole tensors, and this rank's bytes as stored (f32 masters, or a frozen base's
  // bf16 or packed codes).
  int64_t trainableElements = 0, frozenElements = 0;
  uint64_t trainableBytes = 0, frozenBytes = 0;
  uint64_t cacheBytes = 0;      // cache/: the K/V cache of an inference plan
  uint64_t generationStateBytes = 0;  // generate/: the stored self-conditioning logits
  uint64_t constantBytes = 0;   // dg.constant values
  uint64_t activationBytes = 0;     // the activations arena, shared by the entry points
  uint64_t commBufferBytes = 0;     // the communication arena: collectives' results, all_to_all capacity
  uint64_t workspaceBytes = 0;      // kernel scratch the plan reserves: none (no kernel declares any)
  // --optimizer-offload: the host arena (offloaded AdamW moments and the staging of their update),
  // outside the device peak; the bytes optimizer_step copies between device and host, and the bytes
  // its host updates read and write.
  uint64_t hostBytes = 0;
  uint64_t hostMomentBytes = 0;
  uint64_t pcieBytesPerStep = 0;
  uint64_t hostUpdateBytes = 0;
  // The planner's numbers for the entry point with the largest activations arena.
  std::string largestEntry;
  mlir::dg::PoolPacking activationPacking;
  mlir::dg::PoolPacking commBufferPacking;  // the entry with the largest communication arena
  // One step of one micro-batch: corrupt, the largest train_step bucket, gradient_check and
  // optimizer_step (mode infer: every entry, the largest forward bucket).
  int64_t flopsPerStep = 0;
  // FLOPs dg-recompute adds to those entries (its clones, marked dg.recomputed); absent when
  // nothing is recomputed.
  std::optional<int64_t> recomputeFlops;
  // Bytes this rank receives in that step.
  uint64_t communicationBytes = 0;

  uint64_t staticBytes() const {
    return parameterBytes + gradientBytes + optimizerBytes + cacheBytes + generationStateBytes + constantBytes;
  }
  // Every arena of the plan: the runtime allocates them all when the plan loads.
  uint64_t peakBytes() const { return staticBytes() + activationBytes + commBufferBytes + workspaceBytes; }
};

// What no implementation of the layout can avoid receiving per rank and step (ring collectives):
// the gradients' reduce-scatter and the parameters' all-gather over each parameter's replicas,
// the expert dispatch and combine of the routed rows, and Megatron's two tensor-parallel
// exchanges of the [tokens, hidden] activations per layer and direction.
struct AnalyticMinimum {
  uint64_t parameterBytes = 0;
  uint64_t expertDispatchBytes = 0;
  uint64_t tensorParallelBytes = 0;
  uint64_t total() const { return parameterBytes + expertDispatchBytes + tensorParallelBytes; }
};

// Per entry point of rank 0: FLOPs, the activations arena and the plan steps (`plan` is rank 0's).
void printEntryReport(mlir::ModuleOp program, const dgemma::Plan& plan);
// `memory`: the planner's numbers per entry function (by symbol name), from the planning stage's
// MemoryPlanObserver.
RankReport rankReport(mlir::ModuleOp program, const dgemma::Plan& plan,
                      const std::map<std::string, mlir::dg::EntryMemoryPlan>& memory);
// From the annotated whole-program module (dg.shardings on every op) and the layout.
AnalyticMinimum analyticMinimum(mlir::ModuleOp annotated, const mlir::dg::ShardingOptions& layout, int64_t hiddenSize);
// `accelerator` prices the host offload's copies and update (predictHostOffload).
void printRankReport(const std::vector<RankReport>& ranks, const AnalyticMinimum& minimum,
                     const dgemma::Accelerator& accelerator);
// CostOpInterface's FLOPs of the entry points one optimizer step of one micro-batch runs (the
// entries rankReport counts communication over).
uint64_t stepFlops(mlir::ModuleOp program);
// The compiler's time per pass (and the tool's own phases, lowering and validation), summed over ranks.
void printPassTimes(const mlir::dg::PassTimes& times);
