// The linear temperature schedule of block-diffusion sampling (docs/generation.md, "The algorithm").
#pragma once

#include <cstdint>

namespace dgemma {

// The temperature of the decoder pass with `remaining` steps left out of `maxSteps` (remaining
// counts down from maxSteps to 1), t_min + (t_max - t_min) * remaining / maxSteps, rounded as
// transformers computes it: the step ratio is an f32 division of the two counts, the width
// t_max - t_min is taken in double and rounded to f32 once, and the product and the sum are f32.
// The first pass gets t_max; the last gets t_min + (t_max - t_min) / maxSteps, never t_min itself.
float scheduledTemperature(double tMin, double tMax, int64_t remaining, int64_t maxSteps);

}  // namespace dgemma
