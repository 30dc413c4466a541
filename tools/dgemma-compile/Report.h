// dgemma-compile --report: per entry point the FLOPs and scratch of rank 0's program, and per rank
// the static memory (parameters, gradient buffers, optimizer state, inference run state), the activation arena and the
// communication of one optimizer step, next to the analytic minimum for the layout.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "compiler/Pipeline/Pipeline.h"
#include "mlir/IR/BuiltinOps.h"
#include "plan/Plan.h"

struct RankReport {
  int64_t rank = 0;
  uint64_t parameterBytes = 0;  // the model's parameters (f32 masters)
  uint64_t gradientBytes = 0;   // grad/ buffers
  uint64_t optimizerBytes = 0;  // optimizer/ state (AdamW moments)
  uint64_t cacheBytes = 0;      // cache/: the K/V cache of an inference plan
  uint64_t generationStateBytes = 0;  // generate/: the stored self-conditioning logits
  uint64_t scratchBytes = 0;    // the activation arena, shared by the entry points
  // Bytes this rank receives in one step of one micro-batch: corrupt, the largest train_step
  // bucket, gradient_check and optimizer_step (forward alone in mode infer).
  uint64_t communicationBytes = 0;
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

void printEntryReport(mlir::ModuleOp program);
RankReport rankReport(mlir::ModuleOp program, const dgemma::Plan& plan);
// From the annotated whole-program module (dg.shardings on every op) and the layout.
AnalyticMinimum analyticMinimum(mlir::ModuleOp annotated, const mlir::dg::ShardingOptions& layout, int64_t hiddenSize);
void printRankReport(const std::vector<RankReport>& ranks, const AnalyticMinimum& minimum);
// CostOpInterface's FLOPs of the entry points one optimizer step of one micro-batch runs (the
// entries rankReport counts communication over).
uint64_t stepFlops(mlir::ModuleOp program);
