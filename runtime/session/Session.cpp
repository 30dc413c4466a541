#include "runtime/session/Session.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "models/diffusion_gemma/Config.h"
#include "models/diffusion_gemma/WeightSchema.h"
#include "plan/PlanFile.h"
#include "runtime/exec/TimingBackend.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/io/Safetensors.h"
#include "support/Error.h"

namespace dgemma {

namespace {

// Fills the plan's parameters from --weights: for DiffusionGemma through the checkpoint rules of
// docs/model.md (either text prefix, tied copies checked equal), otherwise by name.
void loadPlanWeights(Executor& executor, const std::string& weightsPath, const std::string& planPath) {
  const Plan& plan = executor.plan();
  if (plan.modelFamily != ModelFamily::DiffusionGemma) {
    loadWeights(executor, weightsPath);
    return;
  }
  DiffusionGemmaConfig config = parseDiffusionGemmaConfig(plan.modelConfig, planPath + ": model.config");
  SafetensorsDirectory checkpoint = SafetensorsDirectory::open(weightsPath);
  ResolvedCheckpoint resolved = resolveCheckpointNames(config, checkpoint);
  // Only a plan with image entries declares the vision parameters (models/diffusion_gemma/Builder.h).
  const bool readsImages = std::any_of(plan.parameters.begin(), plan.parameters.end(), [](const Parameter& parameter) {
    return parameter.name.rfind(kVisionTowerPrefix, 0) == 0;
  });
  if (!resolved.visionTensorNames.empty() && !readsImages)
    std::cerr << "dgemma-run: warning: " << weightsPath << ": " << resolved.visionTensorNames.size()
              << " vision tensors ignored (the plan has no image entries; dgemma-compile --images-per-example)\n";
  loadMappedWeights(executor, weightsPath, [&](const std::string& name) -> std::optional<SafetensorsLocation> {
    for (const auto* tensors : {&resolved.textTensors, &resolved.visionTensors})
      if (auto found = tensors->find(name); found != tensors->end()) return found->second;
    return std::nullopt;
  });
}

// How many rank plans `planDir` holds: rank-0.dgplan, rank-1.dgplan, ... without a gap.
int64_t rankPlansIn(const std::string& planDir) {
  int64_t count = 0;
  while (std::filesystem::exists(planFileForRank(planDir, count))) ++count;
  return count;
}

}  // namespace

Plan readRankPlan(const std::string& planDir, int64_t rank) {
  std::string path = planFileForRank(planDir, rank);
  if (!std::filesystem::exists(path)) throw InputError("--plan: " + path + " does not exist (is " + planDir + " a plan directory?)");
  return readPlanFile(path);
}

void checkRankPlanCount(const std::string& planDir, int64_t worldSize) {
  const int64_t rankPlans = rankPlansIn(planDir);
  if (rankPlans != worldSize)
    throw InputError("--plan: " + planDir + " holds " + std::to_string(rankPlans) + " rank plan" +
                     (rankPlans == 1 ? "" : "s") + ", but the run has " + std::to_string(worldSize) + " rank" +
                     (worldSize == 1 ? "" : "s") + " (WORLD_SIZE, --nproc-per-node)");
}

Plan loadPlan(const SessionOptions& options) {
  if (std::filesystem::exists(planFileForRank(options.planDir, 0))) checkRankPlanCount(options.planDir, options.worldSize);
  Plan plan = readRankPlan(options.planDir, options.rank);
  if (plan.worldSize != options.worldSize || plan.rank != options.rank)
    throw InputError(planFileForRank(options.planDir, options.rank) + ": the plan is rank " + std::to_string(plan.rank) +
                     " of " + std::to_string(plan.worldSize) + ", this process is rank " + std::to_string(options.rank) +
                     " of " + std::to_string(options.worldSize));
  return plan;
}

std::string planContentHash(const std::string& planPath) {
  constexpr std::streamoff kHashOffset = 32;  // docs/plan-format.md, "Container"
  std::ifstream file(planPath, std::ios::binary);
  unsigned char bytes[8] = {};
  if (!file.seekg(kHashOffset) || !file.read(reinterpret_cast<char*>(bytes), sizeof bytes))
    throw InputError(planPath + ": cannot read the content hash");
  uint64_t hash = 0;
  for (int i = 0; i < 8; ++i) hash |= static_cast<uint64_t>(bytes[i]) << (8 * i);
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(hash));
  return text;
}

std::unique_ptr<Session> openSession(const SessionOptions& options) { return openSession(options, loadPlan(options)); }

std::unique_ptr<Session> openSession(const SessionOptions& options, Plan plan) {
  if (options.weights.empty() == options.init.empty()) throw InputError("give exactly one of --weights DIR and --init random");
  auto session = std::make_unique<Session>();
  session->plan = std::move(plan);
  session->planPath = planFileForRank(options.planDir, options.rank);
  session->rank = options.rank;
  session->worldSize = options.worldSize;
  session->backend = createBackend(options.backend, options.threads, options.device);
  if (options.timeKernels) session->backend = std::make_unique<TimingBackend>(std::move(session->backend));
  MeshCommunicators communicators =
      connectMesh(session->plan.mesh, *session->backend, options.rank, options.worldSize, options.rendezvous, session->planPath);
  session->communicators = std::move(communicators.axes);
  session->world = std::move(communicators.world);
  session->executor =
      std::make_unique<Executor>(session->plan, *session->backend, session->communicators, session->planPath);
  if (!options.weights.empty()) loadPlanWeights(*session->executor, options.weights, session->planPath);
  else initializeWeights(*session->executor, options.seed);
  return session;
}

}  // namespace dgemma
