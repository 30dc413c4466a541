#include "runtime/rl/GroupAdvantages.h"

#include <cmath>
#include <numeric>
#include <random>
#include <stdexcept>

namespace dgemma {

PromptOrder::PromptOrder(int64_t prompts, uint64_t seed) : prompts_(prompts), seed_(seed) {
  if (prompts < 1) throw std::invalid_argument("PromptOrder: expected at least one prompt");
}

int64_t PromptOrder::promptAt(int64_t position) {
  const int64_t epoch = position / prompts_;
  if (epoch != epoch_) {
    permutation_.resize(static_cast<size_t>(prompts_));
    std::iota(permutation_.begin(), permutation_.end(), int64_t{0});
    std::mt19937_64 engine(seed_ ^ (0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(epoch + 1)));
    for (int64_t i = prompts_ - 1; i > 0; --i) {
      // engine() % (i + 1) has a bias below 2^-40 for any prompt count that fits in memory.
      const int64_t j = static_cast<int64_t>(engine() % static_cast<uint64_t>(i + 1));
      std::swap(permutation_[static_cast<size_t>(i)], permutation_[static_cast<size_t>(j)]);
    }
    epoch_ = epoch;
  }
  return permutation_[static_cast<size_t>(position % prompts_)];
}

std::vector<double> groupAdvantages(const std::vector<double>& rewards, int64_t groupSize) {
  if (groupSize < 2 || rewards.size() % static_cast<size_t>(groupSize) != 0)
    throw std::invalid_argument("groupAdvantages: expected groups of at least 2 rewards");
  std::vector<double> advantages(rewards.size());
  for (size_t first = 0; first < rewards.size(); first += static_cast<size_t>(groupSize)) {
    bool allEqual = true;
    for (int64_t i = 1; i < groupSize; ++i) allEqual = allEqual && rewards[first + i] == rewards[first];
    if (allEqual) continue;  // exactly 0, where rounding in the mean could leave a residue
    double mean = 0;
    for (int64_t i = 0; i < groupSize; ++i) mean += rewards[first + i];
    mean /= static_cast<double>(groupSize);
    double squares = 0;
    for (int64_t i = 0; i < groupSize; ++i) squares += (rewards[first + i] - mean) * (rewards[first + i] - mean);
    const double deviation = std::sqrt(squares / static_cast<double>(groupSize - 1));
    for (int64_t i = 0; i < groupSize; ++i) advantages[first + i] = (rewards[first + i] - mean) / (deviation + 1e-4);
  }
  return advantages;
}

void scaleNegativeAdvantages(std::vector<double>& advantages, double scale) {
  if (!(scale >= 0 && scale <= 1)) throw std::invalid_argument("scaleNegativeAdvantages: expected a scale in [0, 1]");
  for (double& advantage : advantages)
    if (advantage < 0) advantage *= scale;
}

}  // namespace dgemma
