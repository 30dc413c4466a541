#include "runtime/generate/StopRule.h"

#include <algorithm>

#include "support/Error.h"

namespace dgemma {

StopRule::StopRule(int64_t stabilityThreshold, double confidenceThreshold, int64_t canvasLength)
    : stabilityThreshold_(stabilityThreshold), confidenceThreshold_(confidenceThreshold), canvasLength_(canvasLength) {
  if (stabilityThreshold < 0) throw InputError("stability_threshold: expected an integer >= 0, got " + std::to_string(stabilityThreshold));
  reset();
}

void StopRule::reset() { history_.assign(stabilityThreshold_ * canvasLength_, -1); }

bool StopRule::updateStable(std::span<const int64_t> argmax) {
  if (static_cast<int64_t>(argmax.size()) != canvasLength_)
    throw RuntimeError("StopRule: expected an argmax canvas of " + std::to_string(canvasLength_) + " ids");
  if (stabilityThreshold_ == 0) return true;
  bool stable = true;
  for (int64_t entry = 0; entry < stabilityThreshold_ && stable; ++entry)
    stable = std::equal(argmax.begin(), argmax.end(), history_.begin() + entry * canvasLength_);
  std::copy(history_.begin() + canvasLength_, history_.end(), history_.begin());
  std::copy(argmax.begin(), argmax.end(), history_.end() - canvasLength_);
  return stable;
}

bool StopRule::confident(std::span<const float> entropy) const {
  double sum = 0;
  for (float value : entropy) sum += value;
  const float mean = static_cast<float>(sum / static_cast<double>(entropy.size()));
  return mean < static_cast<float>(confidenceThreshold_);
}

bool StopRule::shouldStop(std::span<const int64_t> argmax, std::span<const float> entropy) {
  const bool stable = updateStable(argmax);
  return confident(entropy) && stable;
}

}  // namespace dgemma
