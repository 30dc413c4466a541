// The loop of `dgemma-run rl` (docs/rl.md): on-policy GRPO for block diffusion. Per step, a group
// of rollouts per prompt from the compiled sampler (an inference plan holding the policy's current
// weights), rewards from a verifier, group-normalised advantages, then the policy loss of the
// training plan (dgemma-compile --policy-loss grpo) over one or more inner updates with the
// log-probability estimate's noise shared by the old policy, the reference and every update.
// Everything a step does is a function of (seed, step, prompt, member) and the checkpointed state,
// so a run is reproducible and a resumed run continues the uninterrupted one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/rl/reward/Reward.h"
#include "runtime/session/Session.h"

namespace dgemma {

// One prompt of the set: tokenized with the chat template and the generation prompt.
struct RlPrompt {
  std::string where;  // "FILE:LINE"
  std::vector<int64_t> promptIds;
  std::string text;             // what the reward sees as the prompt: the messages' text
  nlohmann::json reference;     // the row's "reference" (null when it has none)
};

struct RlOptions {
  SessionOptions session;   // the training plan (--plan), --weights (also the KL reference), --seed, --backend
  std::string rolloutPlan;  // an inference plan of the same model (dgemma-compile --mode infer), one rank
  std::string prompts;      // --prompts FILE.jsonl, for messages and the run config
  int64_t steps = 0;
  double maxSeconds = 0;        // > 0: stop (and save) after the step that reaches this wall-clock budget
  int64_t groupSize = 8;        // G rollouts per prompt
  int64_t promptsPerStep = 4;   // prompts per step (all ranks together)
  int64_t innerUpdates = 1;     // μ optimizer updates per batch of rollouts
  int64_t diffusionSamples = 1; // diffusion times per completion block in the estimate
  int64_t maxNewTokens = 0;     // 0: the rollout plan's
  int64_t denoisingSteps = 0;   // 0: the rollout plan's max_denoising_steps
  double temperature = 1.0;     // scales the sampler's temperature schedule for the rollouts
  double passThreshold = 1.0;   // a rollout passes when its reward is at least this
  double negativeAdvantageScale = 1.0;  // multiplies the negative advantages (scaleNegativeAdvantages)
  double lr = 1e-5;
  double minLr = 0.0;
  int64_t warmupSteps = 0;
  std::string decayStyle = "constant";
  std::string saveDir;
  int64_t saveEvery = 0;
  int keep = 0;
  bool resume = false;
  std::string metrics;
  std::string tensorboard;
  std::string rewardName;  // for the run config: "exact", "numeric", "regex" or "command"
};

// Runs the loop on `policy` (this rank's session of the training plan). Every rank calls it with the
// same options and prompts; rank 0 alone prints and writes metrics, TensorBoard and manifests.
int runGrpo(const RlOptions& options, Session& policy, const std::vector<RlPrompt>& prompts, const Tokenizer& tokenizer,
            RewardFunction& reward);

}  // namespace dgemma
