// A scoring command as the reward function (docs/rl.md, "Rewards"): one process per
// score() call reads one JSON line per item on stdin and prints one JSON line per item, each an
// object with a finite number "reward".
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "runtime/rl/reward/Reward.h"

namespace dgemma {

struct RewardCommandOptions {
  std::string command;                       // run with /bin/sh -c
  std::chrono::milliseconds timeout{60000};  // for one score() call, start to exit
};

std::unique_ptr<RewardFunction> makeCommandReward(const RewardCommandOptions& options);

}  // namespace dgemma
