#include "runtime/session/Session.h"

#include <filesystem>

#include "plan/PlanFile.h"
#include "runtime/exec/TimingBackend.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/session/GlobalTensors.h"
#include "support/Error.h"

namespace dgemma {

namespace {

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

std::unique_ptr<Session> openSession(const SessionOptions& options) { return openSession(options, loadPlan(options)); }

std::unique_ptr<Session> openSession(const SessionOptions& options, Plan plan) {
  if (options.weights.empty() == options.init.empty()) throw InputError("give exactly one of --weights DIR and --init random");
  auto session = std::make_unique<Session>();
  session->plan = std::move(plan);
  session->planPath = planFileForRank(options.planDir, options.rank);
  session->rank = options.rank;
  session->worldSize = options.worldSize;
  session->model = &modelAdapterFor(session->plan.modelFamily);
  session->backend = createBackend(options.backend, options.threads, options.device);
  if (options.timeKernels) session->backend = std::make_unique<TimingBackend>(std::move(session->backend));
  MeshCommunicators communicators =
      connectMesh(session->plan.mesh, *session->backend, options.rank, options.worldSize, options.rendezvous, session->planPath);
  session->communicators = std::move(communicators.axes);
  session->world = std::move(communicators.world);
  session->executor =
      std::make_unique<Executor>(session->plan, *session->backend, session->communicators, session->planPath);
  if (!options.weights.empty()) session->model->loadWeights(*session->executor, options.weights, session->planPath);
  else initializeWeights(*session->executor, options.seed);
  if (!options.adapter.empty()) {
    loadAdapter(*session, options.adapter);
  } else if (session->plan.adapter && !options.weights.empty()) {
    const ModelAdapter& model = *session->model;
    initializeWeights(*session->executor, options.seed,
                      [&](const Parameter& parameter) { return model.isAdapterParameter(parameter.name); });
  }
  return session;
}

void loadAdapter(Session& session, const std::string& directory) {
  std::map<std::string, HostTensor> tensors = session.model->readAdapter(session.plan, directory);
  for (const Parameter& parameter : session.plan.parameters) {
    auto found = tensors.find(parameter.name);
    if (found == tensors.end()) continue;
    const std::string what = "--adapter: " + directory + ": " + parameter.name;
    const HostTensor converted = convertDType(found->second, session.plan.buffers[parameter.buffer].dtype, what);
    session.executor->setParameter(
        parameter.name, cutBox(converted, parameter.globalShape, {parameter.shardOffset, parameter.shardShape}, what));
  }
}

}  // namespace dgemma
