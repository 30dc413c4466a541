// The "stable and confident" stop rule of one row's canvas (docs/generation.md, "The algorithm").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dgemma {

class StopRule {
 public:
  // `stabilityThreshold` previous argmax canvases must equal the current one (0: always stable);
  // the canvas is confident when its mean entropy is below `confidenceThreshold`.
  StopRule(int64_t stabilityThreshold, double confidenceThreshold, int64_t canvasLength);

  // Forgets the history (every entry -1, which no argmax equals), at the start of each canvas.
  void reset();

  // Whether `argmax` equals every canvas in the history; then pushes it, dropping the oldest.
  bool updateStable(std::span<const int64_t> argmax);

  // Whether the mean of `entropy` is below the threshold: the sum accumulated in double, the mean
  // rounded to f32 and compared with the threshold rounded to f32 (torch compares in f32).
  bool confident(std::span<const float> entropy) const;

  // One denoising step of the rule: updateStable and confident, both evaluated.
  bool shouldStop(std::span<const int64_t> argmax, std::span<const float> entropy);

 private:
  int64_t stabilityThreshold_;
  double confidenceThreshold_;
  int64_t canvasLength_;
  std::vector<int64_t> history_;  // stabilityThreshold_ canvases, the oldest first
};

}  // namespace dgemma
