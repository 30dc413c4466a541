// One AdamW update of a training plan (docs/training.md, "The optimizer step as IR"): the plan's
// optimizer_step entry fed the step's rate, Adam's bias corrections for the n-th applied update
// (computed in double) and the scale of the summed gradients. What `dgemma-run train` and
// `dgemma-run rl` both run after summing a step's gradients into the plan's buffers.
#pragma once

#include <cstdint>

#include "runtime/session/Session.h"
#include "runtime/train/TrainPlan.h"

namespace dgemma {

// Runs optimizer_step as the `appliedUpdates`-th update (1 for the first) at rate `lr`, the gradient
// buffers' sums scaled by `gradientScale`; it zeroes the buffers. Returns grad_norm.
float applyOptimizerUpdate(Session& session, const TrainPlan& trainPlan, int64_t appliedUpdates, double lr,
                           double gradientScale);

}  // namespace dgemma
