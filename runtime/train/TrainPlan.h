// What `dgemma-run train` needs to know about a training plan (dgemma-compile --mode train), read
// and checked once before anything runs: the entry points' buckets, the optimizer's settings and
// which parameters are the model and which the optimizer's state (docs/training.md, "The training
// loop").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/Plan.h"

namespace dgemma {

struct TrainPlan {
  int64_t microBatch = 0;
  int64_t canvasLength = 0;
  std::vector<int64_t> promptLengths;  // the train_step buckets, ascending
  int64_t padId = 0;                   // the model config's text_config.pad_token_id
  int64_t vocabSize = 0;
  bool hasEncoderLoss = false;         // train_step outputs encoder_loss
  size_t optimizerStep = 0;            // index of the optimizer_step entry in Plan::entryPoints
  OptimizerSettings optimizer;         // the plan's
  // Gradient names the optimizer step takes ("grad/<parameter>"), in its input order; every
  // train_step bucket outputs each of them.
  std::vector<std::string> gradients;
  std::vector<std::string> modelParameters;      // every parameter not under "optimizer/", plan order
  std::vector<std::string> optimizerParameters;  // "optimizer/exp_avg/<name>", ...: plan order
};

// Throws InputError naming `planPath` and what is missing: a plan compiled with --mode infer, or one
// without the optimizer_step entry (compiled before dg-optimizer-step).
TrainPlan readTrainPlan(const Plan& plan, const std::string& planPath);

}  // namespace dgemma
