// dgemma-compile --auto-layout (docs/parallelism.md, "Layout search"): every TP/SP/EP/DP layout of
// --gpus ranks, each legal one (models/diffusion_gemma/spec/ParallelLayout's checks, the ones an explicit
// layout meets) with every recompute policy, predicted by the analytic cost model (CostModel.h),
// ranked by predicted tokens per second among those that fit --gpu-memory, and the choice; and,
// once the chosen plan is compiled, its prediction next to rank 0's compiled report.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "plan/Plan.h"
#include "compiler/Driver/CostModel.h"

namespace dgemma {

struct LayoutSearchRequest {
  int64_t gpus = 1;                  // --gpus
  uint64_t memoryBytesPerGpu = 0;    // --gpu-memory
  const Accelerator* accelerator = nullptr;  // --gpu
  TrainingShape shape;
  std::vector<int64_t> promptLengths;  // every bucket, for the sequence-parallel divisibility
};

struct RankedCandidate {
  Candidate candidate;
  CostPrediction prediction;
  bool fits = false;
  std::string unbuilt;  // why this build cannot compile the candidate's recompute policy; empty when it can
};

struct RefusedLayout {
  ParallelLayout layout;
  std::string reason;  // the InputError an explicit layout would get
};

struct LayoutSearch {
  std::vector<RankedCandidate> ranked;  // fitting first, then by predicted tokens per second
  std::vector<RefusedLayout> refused;
  std::optional<size_t> chosen;  // the first fitting candidate this build can compile
};

// `unbuiltReason(policy)` says why the compiler cannot build a recompute policy yet (empty when it
// can), so that the choice follows what dgemma-compile accepts.
LayoutSearch searchLayouts(const DiffusionGemmaConfig& config, const LayoutSearchRequest& request,
                           const std::function<std::string(RecomputePolicy)>& unbuiltReason);
void printLayoutSearch(const LayoutSearch& search, const LayoutSearchRequest& request, std::ostream& out);

// "141GiB", "80 GB", "512MiB", "1073741824": a byte count with an optional binary or decimal unit.
// Throws InputError naming `flag` and the expected form.
uint64_t parseByteSize(const std::string& text, const std::string& flag);

// The numbers of one compiled rank that the cost model predicts, read through dgemma-compile
// --report's functions (Report.h), so that the check follows the report when its pools change.
struct CompiledRankCost {
  uint64_t parameterBytes = 0, gradientBytes = 0, optimizerBytes = 0, activationBytes = 0;
  double flops = 0, communicationBytes = 0;
};
CompiledRankCost compiledRankCost(mlir::ModuleOp program, const Plan& plan);
// The chosen candidate's prediction next to its compiled rank 0, with the relative error of each.
void printPredictionCheck(const CostPrediction& predicted, const CompiledRankCost& compiled, std::ostream& out);

}  // namespace dgemma
