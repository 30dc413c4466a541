// The AdamW settings of a training plan: what dgemma-compile asks dg-optimizer-step to compile into
// the optimizer_step entry, and what the plan records for the trainer, which feeds the bias
// corrections 1 - beta^n and so needs the betas (the rest is reported and recorded). Defaults: the
// 26B recipe (docs/training.md, "AdamW and clipping"). Header-only, so the compiler's pipeline and
// the runtime share one definition.
#pragma once

namespace dgemma {

struct OptimizerSettings {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double epsilon = 1e-8;
  double weightDecay = 0.0;
  double maxGradNorm = 1.0;
};

}  // namespace dgemma
