// The analytic cost model of dgemma-compile --auto-layout (docs/parallelism.md, "Layout search"):
// from the model config, the step's shapes and one candidate layout, the per-rank memory pools, the
// FLOPs and collective bytes of one training step, and a step time on a target accelerator. It counts
// what the compiler builds: the train_step's passes (prompt K/V pass, self-conditioning pass 1,
// pass 2, the clean encoder pass), the TP/SP collectives of docs/parallelism.md, expert
// parallelism in the all-gather form the train step is compiled to, and the plan's pools (f32
// masters, f32 gradient buffers, AdamW moments sharded by ZeRO-1). Where CostOpInterface counts a bound (the experts over every token of the EP group,
// of which a rank computes its own experts' routes), the model gives the bound too, so that it can
// be checked against a compiled report; the step time uses the balanced-routing expectation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compiler/Transforms/RecomputePolicy.h"
#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/ParallelLayout.h"

namespace dgemma {

// A target accelerator and its links. Throughputs are datasheet peaks; the efficiency factors
// turn them into what a training step sustains (docs/parallelism.md, "Layout search").
struct Accelerator {
  std::string name;
  double denseBf16Flops = 0;      // FLOP/s, dense bf16 tensor cores
  double denseFp32Flops = 0;      // FLOP/s, fp32 without TF32 (what --precision fp32 asks for)
  double memoryBytesPerSecond = 0;  // HBM
  uint64_t memoryBytes = 0;       // the default --gpu-memory
  double linkBytesPerSecond = 0;  // one direction of the intra-node link (NVLink)
  double networkBytesPerSecond = 0;  // one direction per GPU between nodes (InfiniBand)
  int64_t gpusPerNode = 8;
  double computeEfficiency = 0;   // sustained / peak FLOP/s of the step's GEMMs and attention
  double linkEfficiency = 0;      // sustained / peak bandwidth of the collectives (and of HBM)
  // --optimizer-offload (docs/parallelism.md, "Optimizer-state offload"): one direction of the GPU's
  // host link (PCIe), and the host DRAM bandwidth one GPU's rank gets when every GPU of the node
  // updates on the host at once; both sustain linkEfficiency of their peak.
  double hostLinkBytesPerSecond = 0;
  double hostMemoryBytesPerSecond = 0;
};

// The time the host-offloaded update adds to a step if nothing overlaps it: the device<->host copies
// (`pcieBytes`, both directions in turn) and the host's AdamW, bound by its memory traffic
// (`hostUpdateBytes` read and written).
struct HostOffloadSeconds {
  double transfer = 0;
  double update = 0;
};
HostOffloadSeconds predictHostOffload(const Accelerator& accelerator, uint64_t pcieBytes, uint64_t hostUpdateBytes);

// "h200", "h100"; throws InputError naming --gpu and the known names.
const Accelerator& findAccelerator(const std::string& name);
std::string acceleratorNames();

// The policies the search ranks: dg-recompute's kinds, full as every layer (full:1).
using RecomputePolicy = mlir::dg::RecomputePolicy::Kind;
// The policy's `--recompute` text.
std::string recomputeName(RecomputePolicy policy);
inline constexpr RecomputePolicy kRecomputePolicies[] = {RecomputePolicy::None, RecomputePolicy::Selective,
                                                         RecomputePolicy::Full};

// What one rank's training step is built for (the largest prompt bucket: the step the arenas are sized for).
struct TrainingShape {
  int64_t microBatch = 1;    // per data-parallel rank (--micro-batch)
  int64_t promptLength = 0;  // the largest --prompt-len bucket
  int64_t canvasLength = 0;
  bool bf16 = false;         // --precision bf16: activations and parameter copies in bf16
  bool selfConditioning = true;  // --self-cond-prob > 0: pass 1 runs
  bool encoderLoss = true;       // --encoder-loss-weight > 0: the clean pass runs
  bool routerAuxLoss = false;    // --aux-loss-coeff > 0: the prompt's K/V pass stays apart from the clean pass
  bool distributedOptimizer = true;
};

struct Candidate {
  ParallelLayout layout;
  RecomputePolicy recompute = RecomputePolicy::None;
};

// One rank's numbers (every rank of a layout has the same shapes).
struct CostPrediction {
  // Memory pools, bytes (the pools of dgemma-compile --report).
  uint64_t parameterBytes = 0;   // f32 masters of this rank's shard of every text tensor
  uint64_t gradientBytes = 0;    // f32 gradient buffers of the trainable ones
  uint64_t optimizerBytes = 0;   // AdamW moments, ZeRO-1 sharded
  uint64_t activationBytes = 0;  // the activation arena's peak under the recompute policy
  uint64_t staticBytes() const { return parameterBytes + gradientBytes + optimizerBytes; }
  uint64_t peakBytes() const { return staticBytes() + activationBytes; }

  // One step of one micro-batch plus the optimizer step.
  double flops = 0;               // expected, with balanced routing, recomputation included
  double flopsBound = 0;          // as CostOpInterface counts it: the experts over every token of the EP group
  double communicationBytes = 0;  // received, as CommunicationOpInterface counts it
  double computeSeconds = 0;      // max(FLOPs, HBM traffic) at the sustained rates
  double communicationSeconds = 0;
  double stepSeconds() const { return computeSeconds + communicationSeconds; }  // no overlap (docs/parallelism.md)
  int64_t tokensPerStep = 0;      // prompt + canvas tokens of the global micro-batch
  double tokensPerSecond() const { return stepSeconds() > 0 ? double(tokensPerStep) / stepSeconds() : 0; }
};

CostPrediction predictCost(const DiffusionGemmaConfig& config, const TrainingShape& shape, const Candidate& candidate,
                           const Accelerator& accelerator);

}  // namespace dgemma
