// `dgemma-run rl` (docs/rl.md): on-policy GRPO from prompts and a verifier.
#pragma once

#include <string>

#include "runtime/rl/GrpoTrainer.h"

namespace dgemma::tool {

struct RlFlags {
  RlOptions options;
  std::string tokenizer;      // default: --weights
  std::string reward;         // --reward exact | numeric | regex
  std::string rewardCommand;  // --reward-command CMD
  double rewardTimeoutSeconds = 60;
  bool skipBadRows = false;
  bool overwrite = false;     // --overwrite: a fresh run deletes another run's checkpoints in --save-dir
  std::string runIdentity;    // recorded in --save-dir (SaveDirectoryClaim.h)
};

// Opens this rank's session of the training plan (its run options already applied to `flags`),
// reads the prompts and runs the loop.
int runRl(RlFlags& flags, Plan plan);

}  // namespace dgemma::tool
