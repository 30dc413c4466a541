// How `dgemma-run train --resume` and `--resume-from DIR` continue a run from a checkpoint
// (docs/training.md, "The training loop" and "Checkpoints"): which checkpoint, whether it continues
// this run, and the run state it restores.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

#include "runtime/exec/Executor.h"
#include "runtime/train/TrainPlan.h"
#include "runtime/train/TrainSplit.h"
#include "runtime/train/Trainer.h"
#include "runtime/train/WorldGroup.h"

namespace dgemma {

// The checkpoint's tensor of applied optimizer steps (skipped ones excluded): Adam's bias
// corrections and the LR schedule follow it, so it is optimizer state and travels in the
// checkpoint's optimizer group.
inline const std::string kOptimizerStepCount = "optimizer/step";

// The run a checkpoint is to continue, as the Trainer holds it.
struct ResumedRun {
  const TrainOptions& options;
  const TrainPlan& trainPlan;
  TrainSplit& train;
  int64_t globalBatch = 0;
  const nlohmann::json& identity;  // what the checkpoint must match (checkpointIdentity)
  const nlohmann::json& config;    // the run's configuration; its "trajectory" must match the checkpoint's
  nlohmann::json rngState;         // what the manifest's "rng" must record
};

// The counters a checkpoint restores besides the parameters.
struct ResumedCounters {
  int64_t step = 0;             // optimizer steps taken, skipped ones included
  int64_t optimizerSteps = 0;   // optimizer steps applied
  int64_t consumedSamples = 0;  // the next global sample index
  int64_t consumedTokens = 0;   // real tokens of the consumed samples
};

// Finds the checkpoint (--resume-from's directory, or the newest step directory of --save-dir,
// which every rank of `world` must see alike), checks that it continues `run`, sets every model and
// optimizer parameter of `executor` to this rank's box of it and returns the counters; prints the
// step it resumed from on `out`. Throws InputError naming the checkpoint and the fault; a refused
// newest checkpoint names the older complete one to give --resume-from.
ResumedCounters resumeFromCheckpoint(const ResumedRun& run, WorldGroup& world, Executor& executor, std::ostream& out);

}  // namespace dgemma
