// The two pure pieces of a GRPO step's bookkeeping (docs/rl.md, "One step"): which prompts a step
// takes, and each rollout's group-normalised advantage.
#pragma once

#include <cstdint>
#include <vector>

namespace dgemma {

// The prompt set's order: epoch e visits every prompt once, in a permutation drawn from (seed, e)
// by Fisher-Yates over std::mt19937_64 (whose output the standard fixes, unlike std::shuffle's use
// of it), so the order is the same on every platform, rank and resume.
class PromptOrder {
 public:
  PromptOrder(int64_t prompts, uint64_t seed);

  // The prompt at global position `position` (0, 1, ... over all epochs).
  int64_t promptAt(int64_t position);
  int64_t prompts() const { return prompts_; }

 private:
  int64_t prompts_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> permutation_;
};

// DeepSeekMath's outcome advantage, as TRL computes it: within each group of `groupSize`
// consecutive rewards, A = (r - mean) / (std + 1e-4) with the unbiased (n - 1) standard deviation,
// so a group whose rewards are all equal gets A = 0 everywhere. rewards.size() must be a multiple
// of groupSize >= 2 (std::invalid_argument otherwise).
std::vector<double> groupAdvantages(const std::vector<double>& rewards, int64_t groupSize);

// Multiplies every negative advantage by `scale` in [0, 1] (--negative-advantage-scale; 1 leaves
// GRPO's advantages, 0 learns from the better-than-average rollouts only). The estimate of a failed
// completion scores all its tokens, so a negative advantage also pushes down the tokens it got
// right; scaling it weakens that push without removing the contrast within the group (docs/rl.md,
// "One step"). std::invalid_argument outside [0, 1].
void scaleNegativeAdvantages(std::vector<double>& advantages, double scale);

}  // namespace dgemma
