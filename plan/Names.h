// Names that the compiler gives and the runtime relies on: the string contracts of a plan's
// parameters and entry points. Header-only and dependency-free, so that the dialect, the compiler
// passes and the runtime share one spelling.
#pragma once

namespace dgemma {

// dg-autodiff hands out the gradient of trainable parameter P as the output "grad/P"; the
// optimizer_step entry takes them as inputs under the same names.
inline constexpr const char* kGradientPrefix = "grad/";

// Optimizer state (Adam moments) lives in plan parameters under this prefix, e.g.
// "optimizer/exp_avg/<parameter>" (written by dg-optimizer-step). A model checkpoint does not carry
// them: they start at zero unless a training checkpoint restores them.
inline constexpr const char* kOptimizerStatePrefix = "optimizer/";

}  // namespace dgemma
