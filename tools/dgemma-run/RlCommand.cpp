#include "tools/dgemma-run/RlCommand.h"

#include <iostream>
#include <limits>
#include <memory>

#include "runtime/rl/reward/RewardCommand.h"
#include "runtime/train/SaveDirectoryClaim.h"
#include "runtime/train/TrainPlan.h"
#include "support/Error.h"
#include "tools/dgemma-run/PromptRows.h"

namespace dgemma::tool {

namespace {

std::unique_ptr<RewardFunction> rewardOf(RlFlags& flags) {
  if (flags.reward.empty() == flags.rewardCommand.empty())
    throw InputError("give exactly one of --reward exact|numeric|regex and --reward-command CMD");
  if (!flags.rewardCommand.empty()) {
    RewardCommandOptions command;
    command.command = flags.rewardCommand;
    command.timeout = std::chrono::milliseconds(static_cast<int64_t>(flags.rewardTimeoutSeconds * 1000));
    flags.options.rewardName = "command";
    return makeCommandReward(command);
  }
  flags.options.rewardName = flags.reward;
  return makeBuiltinReward(flags.reward);
}

}  // namespace

int runRl(RlFlags& flags, Plan plan) {
  if (flags.options.session.weights.empty())
    throw InputError("--weights: required (the policy starts from it, and it is the KL term's reference)");
  if (flags.overwrite && (flags.options.saveDir.empty() || flags.options.resume))
    throw InputError("--overwrite: needs --save-dir and no --resume (it deletes the checkpoints --resume continues)");
  std::unique_ptr<RewardFunction> reward = rewardOf(flags);
  std::unique_ptr<SaveDirectoryClaim> claim;
  if (!flags.options.saveDir.empty() && plan.rank == 0) {
    SaveDirectoryRequest request;
    request.saveDir = flags.options.saveDir;
    request.runIdentity = flags.runIdentity.empty() ? newRunIdentity() : flags.runIdentity;
    request.resuming = flags.options.resume;
    request.overwrite = flags.overwrite;
    claim = std::make_unique<SaveDirectoryClaim>(request);
  }
  const Tokenizer tokenizer(flags.tokenizer.empty() ? flags.options.session.weights : flags.tokenizer);
  const TrainPlan trainPlan = readTrainPlan(plan, flags.options.session.planDir);
  tokenizer.checkVocabSize(trainPlan.vocabSize);

  // The rollout plan's prefill buckets are checked when the trainer opens it.
  PromptLimits limits;
  limits.maxPromptLength = std::numeric_limits<int64_t>::max();
  limits.vocabSize = trainPlan.vocabSize;
  PromptRows read = readPromptRows(flags.options.prompts, tokenizer, limits, /*requireCompletion=*/false,
                                   flags.skipBadRows, flags.skipBadRows);
  if (plan.rank == 0)
    for (const std::string& reason : read.skipped) std::cerr << "skipped: " << reason << "\n";
  std::vector<RlPrompt> prompts;
  for (PromptRow& row : read.rows) {
    if (reward->name() != "command") {
      try {
        checkReference(reward->name(), row.reference, row.where);
      } catch (const InputError& error) {
        if (!flags.skipBadRows) throw InputError(std::string(error.what()) + " (--skip-bad-rows skips such rows)");
        if (plan.rank == 0) std::cerr << "skipped: " << error.what() << "\n";
        continue;
      }
    }
    prompts.push_back({row.where, std::move(row.promptIds), std::move(row.text), std::move(row.reference)});
  }
  std::unique_ptr<Session> session = openSession(flags.options.session, std::move(plan));
  return runGrpo(flags.options, *session, prompts, tokenizer, *reward);
}

}  // namespace dgemma::tool
