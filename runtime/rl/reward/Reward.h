// Verifiable rewards for reinforcement learning (docs/rl.md, "Rewards"): one reward per
// completion, from a builtin rule (exact, numeric, regex) applied to the completion and the prompt
// row's reference, or from a scoring command (runtime/rl/reward/RewardCommand.h).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dgemma {

struct RewardItem {
  std::string prompt;        // the prompt text as the row gave it
  std::string completion;    // the decoded completion (special tokens removed)
  nlohmann::json reference;  // the row's "reference" value
  std::string where;         // "FILE:LINE" of the prompt row, for messages
};

class RewardFunction {
 public:
  virtual ~RewardFunction() = default;
  // One reward per item, in order. Throws InputError (a reference the rule cannot use) or
  // RuntimeError (the scorer failed), naming the item's `where` and the cause; a failure is never
  // scored as 0.
  virtual std::vector<double> score(const std::vector<RewardItem>& items) = 0;
  virtual std::string name() const = 0;  // "exact", "numeric", "regex", "command"
};

// `--reward exact|numeric|regex`; throws InputError naming --reward for any other name.
std::unique_ptr<RewardFunction> makeBuiltinReward(const std::string& name);

// Checks a row's reference before any generation: exact needs a string or a number, numeric a
// number or a numeric string, regex a string that compiles; a command takes any value. Throws
// InputError "WHERE: reference: expected ..., got ..." (or naming --reward for an unknown name).
void checkReference(const std::string& rewardName, const nlohmann::json& reference, const std::string& where);

}  // namespace dgemma
