#include "runtime/train/Resume.h"

#include <optional>
#include <tuple>
#include <vector>

#include "runtime/train/CheckpointListing.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/ShardedSave.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

// The first field, as a dotted path under `path`, where `before` and `now` differ, with both values;
// objects are compared field by field so that the message names the leaf (lr_schedule.decay_steps),
// not the object that holds it.
std::optional<std::tuple<std::string, nlohmann::json, nlohmann::json>> firstDifference(const std::string& path,
                                                                                      const nlohmann::json& before,
                                                                                      const nlohmann::json& now) {
  if (before == now) return std::nullopt;
  if (now.is_object()) {  // a recorded value that is no object has none of the fields
    for (const auto& [field, value] : now.items()) {
      const nlohmann::json old = before.is_object() && before.contains(field) ? before.at(field) : nlohmann::json();
      if (auto difference = firstDifference(path + "." + field, old, value)) return difference;
    }
    if (before.is_object())
      for (const auto& [field, value] : before.items())
        if (!now.contains(field)) return std::make_tuple(path + "." + field, value, nlohmann::json());
  }
  return std::make_tuple(path, before, now);
}

// One resume: the run it continues and where the restored state goes.
class Resume {
 public:
  Resume(const ResumedRun& run, WorldGroup& world, Executor& executor, std::ostream& out)
      : run_(run), world_(world), executor_(executor), out_(out) {}

  ResumedCounters restore();

 private:
  std::string olderCheckpointAdvice(const std::string& refused, int64_t refusedStep) const;
  void checkResumable(const CheckpointReader& checkpoint) const;
  void checkSameTrajectory(const CheckpointReader& checkpoint) const;

  const ResumedRun& run_;
  WorldGroup& world_;
  Executor& executor_;
  std::ostream& out_;
};

void Resume::checkSameTrajectory(const CheckpointReader& checkpoint) const {
  const nlohmann::json& saved = checkpoint.state().config;
  const auto recorded = saved.find("trajectory");
  const nlohmann::json before = recorded != saved.end() ? *recorded : nlohmann::json();
  if (auto difference = firstDifference("config.trajectory", before, run_.config.at("trajectory"))) {
    const auto& [field, old, now] = *difference;
    throw InputError(checkpoint.directory() + "/manifest.json: " + field + ": the checkpoint's run used " +
                     describeJsonValue(old) + ", this run " + describeJsonValue(now) +
                     " (a resumed run repeats the flags that decide its steps: --seed, --accumulation, the lr schedule "
                     "flags with --decay-steps for a changed --steps, and the same --train data)");
  }
}

// A resume continues from --resume-from's directory, or from the newest step directory in
// --save-dir, and never from an older one in its place: a damaged newest checkpoint is an error
// naming it, and the user chooses an older one explicitly (docs/training.md, "Checkpoints").
ResumedCounters Resume::restore() {
  ResumedCounters counters;
  std::string directory = run_.options.resumeFrom;
  int64_t chosenStep = -1;
  if (directory.empty()) {
    if (std::optional<CheckpointEntry> newest = newestCheckpoint(run_.options.saveDir)) {
      directory = newest->directory;
      chosenStep = newest->step;
    }
  }
  // Every rank must resume the same step: a --save-dir that the ranks do not share would not do.
  const std::vector<int64_t> latestSteps = world_.allGather({chosenStep});
  auto describe = [](int64_t step) { return step < 0 ? std::string("no checkpoint") : "step " + std::to_string(step); };
  for (size_t rank = 1; rank < latestSteps.size(); ++rank)
    if (latestSteps[rank] != latestSteps[0])
      throw InputError("--resume: " + run_.options.saveDir + ": rank " + std::to_string(rank) + " finds " +
                       describe(latestSteps[rank]) + ", rank 0 " + describe(latestSteps[0]) +
                       " (every rank must see the same --save-dir)");
  if (directory.empty())
    throw InputError("--resume: " + run_.options.saveDir +
                     ": no complete checkpoint (a step-NNNNNNNN directory with its manifest.json)");

  std::optional<CheckpointReader> loaded;
  try {
    loaded.emplace(CheckpointReader::load(directory, run_.identity));
    checkResumable(*loaded);
  } catch (const InputError& error) {
    if (!run_.options.resumeFrom.empty()) throw;
    throw InputError(std::string(error.what()) + " " + olderCheckpointAdvice(directory, chosenStep));
  }
  const CheckpointReader& checkpoint = *loaded;
  // Each parameter's box in this plan's layout, assembled from the boxes of whatever layout saved it.
  restoreParameters(checkpoint, "model", run_.trainPlan.modelParameters, executor_);
  restoreParameters(checkpoint, "optimizer", run_.trainPlan.optimizerParameters, executor_);
  const HostTensor count = checkpoint.read("optimizer", kOptimizerStepCount);
  if (count.dtype != DType::I64 || count.numElements() != 1)
    throw InputError(checkpoint.directory() + ": group 'optimizer': tensor '" + kOptimizerStepCount + "': expected one i64");
  counters.optimizerSteps = count.as<int64_t>()[0];
  counters.step = checkpoint.state().step;
  // Applied steps are the steps taken less the skipped ones.
  if (counters.optimizerSteps < 0 || counters.optimizerSteps > counters.step)
    throw InputError(checkpoint.directory() + ": group 'optimizer': tensor '" + kOptimizerStepCount +
                     "': " + std::to_string(counters.optimizerSteps) + " applied optimizer steps, expected 0.." +
                     std::to_string(counters.step) + " (the manifest's step)");
  counters.consumedSamples = checkpoint.state().consumedSamples;
  // The token count is a function of the data order, so it is recounted rather than stored.
  counters.consumedTokens =
      run_.train.tokensBefore(counters.consumedSamples, checkpoint.directory() + "/manifest.json");
  out_ << "resumed from " << checkpoint.directory() << ": step " << counters.step << ", consumed samples "
       << counters.consumedSamples << "\n";
  return counters;
}

// The rest of the message refusing the newest checkpoint `refused`: that --resume does not skip it,
// and how to choose the newest complete one before it.
std::string Resume::olderCheckpointAdvice(const std::string& refused, int64_t refusedStep) const {
  std::string older;
  for (const CheckpointEntry& entry : listCheckpoints(run_.options.saveDir))
    if (entry.step < refusedStep) older = entry.directory;
  return "(--resume: " + refused + " is the newest checkpoint in " + run_.options.saveDir +
         "; --resume does not fall back to an older one: " +
         (older.empty() ? std::string("there is no older complete checkpoint")
                        : "to continue from the newest complete one before it, run with --resume-from " + older +
                              " instead of --resume, which trains and saves its later steps again") +
         ")";
}

// A checkpoint continues this run when it was saved by the same trajectory (config.trajectory),
// and its counters and recorded states are the ones its step implies: every step, a skipped one
// too, consumes one global batch, and rng and data_order_state are what this run recomputes. The
// manifest's checksum catches an accidental edit; these catch one made with the checksum redone.
void Resume::checkResumable(const CheckpointReader& checkpoint) const {
  checkSameTrajectory(checkpoint);
  const std::string manifest = checkpoint.directory() + "/manifest.json";
  const CheckpointState& state = checkpoint.state();
  if (state.step > run_.options.steps)
    throw InputError("--steps " + std::to_string(run_.options.steps) + ": the checkpoint is at step " +
                     std::to_string(state.step) + " already");
  int64_t expected = 0;
  const bool overflows = __builtin_mul_overflow(state.step, run_.globalBatch, &expected);
  if (overflows || expected != state.consumedSamples)
    throw InputError(manifest + ": consumed_samples: " + std::to_string(state.consumedSamples) + ", but step " +
                     std::to_string(state.step) + " x global batch " + std::to_string(run_.globalBatch) + " = " +
                     (overflows ? std::string("more than 2^63") : std::to_string(expected)) +
                     " (every step consumes one global batch; an edited manifest)");
  auto compare = [&](const std::string& name, const nlohmann::json& recorded, const nlohmann::json& recomputed) {
    for (const auto& [key, value] : recomputed.items()) {
      auto found = recorded.find(key);
      if (found == recorded.end() || *found != value)
        throw InputError(manifest + ": " + name + "." + key + ": the checkpoint records " +
                         (found == recorded.end() ? std::string("nothing") : describeJsonValue(*found)) +
                         ", the restore recomputes " + value.dump() + " (an edited manifest, or one of another run)");
    }
    for (const auto& [key, value] : recorded.items())
      if (!recomputed.contains(key))
        throw InputError(manifest + ": " + name + ": " + quoteForMessage(key) + ": not a member this build records");
  };
  compare("rng", state.rng, run_.rngState);
  compare("data_order_state", state.dataOrderState, run_.train.orderState(state.consumedSamples));
}

}  // namespace

ResumedCounters resumeFromCheckpoint(const ResumedRun& run, WorldGroup& world, Executor& executor, std::ostream& out) {
  return Resume(run, world, executor, out).restore();
}

}  // namespace dgemma
