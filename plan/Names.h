// Names that the compiler gives and the runtime relies on: the string contracts of a plan's
// parameters and entry points. Header-only and dependency-free, so that the dialect, the compiler
// passes and the runtime share one spelling.
#pragma once

namespace dgemma {

// dg-autodiff hands out the gradient of trainable parameter P as the output "grad/P". In a plan
// with an optimizer, dg-gradient-buffers turns each into the persistent f32 buffer "grad/P" that
// train_step adds into and optimizer_step reads and zeroes: a gradient buffer, not a model weight.
inline constexpr const char* kGradientPrefix = "grad/";

// The gradient_check entry's output "nonfinite/grad/P" is 0 when every element of the gradient
// buffer grad/P is finite and NaN otherwise.
inline constexpr const char* kNonFinitePrefix = "nonfinite/";

// The entry points dg-gradient-buffers adds besides rewriting train_step and optimizer_step.
inline constexpr const char* kGradientCheckEntry = "gradient_check";
inline constexpr const char* kZeroGradientsEntry = "zero_gradients";

// Optimizer state (Adam moments) lives in plan parameters under this prefix, e.g.
// "optimizer/exp_avg/<parameter>" (written by dg-optimizer-step). A model checkpoint does not carry
// them: they start at zero unless a training checkpoint restores them.
inline constexpr const char* kOptimizerStatePrefix = "optimizer/";

}  // namespace dgemma
