// The memory planner's promise, checked at run time: the fixture model's training entries (with
// self-conditioning and the encoder loss) and its generation entries (prefill, denoise, commit) run
// on a TrackingBackend around the CPU backend, which records every arena and every byte range each
// kernel and copy touches; the most bytes live at once in each arena never exceed the bytes the
// plan gave it (docs/performance.md, "Memory pools").
#include <gtest/gtest.h>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/ir/Inference.h"
#include "dialects/dg/IR/DgOps.h"
#include "plan/Names.h"
#include "plan/PlanFile.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/TrackingBackend.h"

namespace dgemma {
namespace {

const std::string kFixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/all_experts";

// `generation`: an inference plan's settings, which its entries require. `offloadAll`: every
// trainable parameter's AdamW moments and update in the host arena (--optimizer-offload all).
Plan compile(mlir::OwningOpRef<mlir::ModuleOp> module, bool train, std::optional<GenerationSettings> generation = {},
             bool offloadAll = false) {
  EXPECT_TRUE(mlir::succeeded(mlir::verify(*module)));
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = train;
  if (train) pipeline.optimizer = OptimizerSettings{};
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
  mlir::dg::PlanLoweringOptions lowering;
  if (offloadAll)
    module->walk([&](mlir::dg::ParamOp param) {
      const std::string name = param.getName().str();
      if (param.getTrainable() && name.rfind(kGradientPrefix, 0) != 0 && name.rfind(kOptimizerStatePrefix, 0) != 0)
        lowering.offloadedParameters.insert(name);
    });
  auto plan = mlir::dg::lowerToPlan(*module, lowering);
  EXPECT_TRUE(mlir::succeeded(plan));
  plan->generation = generation;
  validatePlan(*plan, "planned-memory-test");
  return std::move(*plan);
}

// Inputs of valid values for any entry: token ids, positions and keys 0, masks and scalars 1.
std::map<std::string, HostTensor> syntheticInputs(const Plan& plan, const EntryPoint& entry) {
  std::map<std::string, HostTensor> inputs;
  for (const NamedBuffer& input : entry.inputs) {
    const Buffer& buffer = plan.buffers[input.buffer];
    HostTensor tensor(buffer.dtype, buffer.shape);
    if (buffer.dtype == DType::F32)
      for (int64_t i = 0; i < tensor.numElements(); ++i) tensor.as<float>()[i] = 1.0f;
    inputs.emplace(input.name, std::move(tensor));
  }
  return inputs;
}

// Runs every entry of `plan` once (in the plan's order) and checks each arena's tracked peak.
void expectTrackedWithinPlan(const Plan& plan) {
  auto tracking = std::make_unique<TrackingBackend>(createBackend("cpu", 2));
  TrackingBackend& tracker = *tracking;
  CommunicatorSet communicators;
  Executor executor(plan, tracker, communicators, "planned-memory-test");
  for (const EntryPoint& entry : plan.entryPoints) executor.run(entry, syntheticInputs(plan, entry));

  ASSERT_EQ(tracker.allocations().size(), plan.arenas.size());
  std::vector<uint64_t> peaks = tracker.peakLiveBytes();
  for (size_t i = 0; i < plan.arenas.size(); ++i) {
    const Arena& arena = plan.arenas[i];
    EXPECT_EQ(tracker.allocations()[i].bytes, arena.bytes) << arena.name;
    EXPECT_LE(peaks[i], arena.bytes) << "arena " << arena.name;
    // The tracker saw the pool in use: the check is not vacuous.
    EXPECT_GT(peaks[i], 0u) << "arena " << arena.name;
    std::printf("%-14s planned %10llu  tracked peak %10llu\n", arena.name.c_str(),
                static_cast<unsigned long long>(arena.bytes), static_cast<unsigned long long>(peaks[i]));
  }
}

TEST(PlannedMemory, TrainingEntriesStayWithinTheirArenas) {
  mlir::MLIRContext context;
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(kFixture + "/config.json");
  mlir::dg::DiffusionGemmaTrainOptions options;
  options.microBatch = 2;
  options.promptLengths = {8};
  options.objective.selfConditioningProb = 0.5;
  options.objective.encoderLossWeight = 1.0;
  Plan plan = compile(mlir::dg::buildDiffusionGemmaTrain(context, config, options), true);
  std::vector<std::string> names;
  for (const Arena& arena : plan.arenas) names.push_back(arena.name);
  EXPECT_EQ(names, (std::vector<std::string>{"parameters", "gradients", "optimizer", "constants", "activations"}));
  expectTrackedWithinPlan(plan);
}

// With the optimizer state offloaded, the host arena is one more allocation, which the copies
// across it fill (the host kernels that update it run untraced).
TEST(PlannedMemory, OffloadedTrainingEntriesStayWithinTheirArenas) {
  mlir::MLIRContext context;
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(kFixture + "/config.json");
  mlir::dg::DiffusionGemmaTrainOptions options;
  options.microBatch = 2;
  options.promptLengths = {8};
  Plan plan = compile(mlir::dg::buildDiffusionGemmaTrain(context, config, options), true, std::nullopt, true);
  std::vector<std::string> names;
  for (const Arena& arena : plan.arenas) names.push_back(arena.name);
  EXPECT_EQ(names, (std::vector<std::string>{"parameters", "gradients", "constants", "activations", "host"}));
  expectTrackedWithinPlan(plan);
}

TEST(PlannedMemory, GenerationEntriesStayWithinTheirArenas) {
  mlir::MLIRContext context;
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(kFixture + "/config.json");
  mlir::dg::DiffusionGemmaInferenceOptions options;
  options.microBatch = 2;
  options.promptLengths = {8};
  GenerationSettings generation;
  generation.canvasLength = config.canvasLength;
  generation.maxNewTokens = 2 * config.canvasLength;
  generation.cacheLength = mlir::dg::inferenceCacheLength(8, generation.maxNewTokens, config.canvasLength);
  generation.eosTokenIds = {1};
  options.cacheLength = generation.cacheLength;
  Plan plan = compile(mlir::dg::buildDiffusionGemmaInference(context, config, options), false, generation);
  std::vector<std::string> names;
  for (const Arena& arena : plan.arenas) names.push_back(arena.name);
  EXPECT_EQ(names, (std::vector<std::string>{"parameters", "run_state", "constants", "activations"}));
  expectTrackedWithinPlan(plan);
}

}  // namespace
}  // namespace dgemma
