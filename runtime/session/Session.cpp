#include "runtime/session/Session.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include "models/diffusion_gemma/Config.h"
#include "models/diffusion_gemma/WeightSchema.h"
#include "plan/PlanFile.h"
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
  if (!resolved.visionTensorNames.empty())
    std::cerr << "dgemma-run: warning: " << weightsPath << ": " << resolved.visionTensorNames.size()
              << " vision tensors ignored (the vision tower is not built yet)\n";
  loadWeights(executor, weightsPath, [&](const std::string& name) -> std::optional<HostTensor> {
    auto found = resolved.textTensors.find(name);
    if (found == resolved.textTensors.end()) return std::nullopt;
    return found->second.file->read(found->second.entry->name);
  });
}

}  // namespace

Plan loadPlan(const SessionOptions& options) {
  std::string path = planFileForRank(options.planDir, options.rank);
  if (!std::filesystem::exists(path)) throw InputError("--plan: " + path + " does not exist (is " + options.planDir + " a plan directory?)");
  return readPlanFile(path);
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
  session->backend = createBackend(options.backend, options.threads);
  for (const MeshAxis& axis : session->plan.mesh)
    session->communicators.add(axis.name, std::make_unique<LocalCommunicator>(*session->backend));
  session->executor =
      std::make_unique<Executor>(session->plan, *session->backend, session->communicators, session->planPath);
  if (!options.weights.empty()) loadPlanWeights(*session->executor, options.weights, session->planPath);
  else initializeWeights(*session->executor, options.seed);
  return session;
}

}  // namespace dgemma
