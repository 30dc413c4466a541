// Names that the compiler gives and the runtime relies on: the string contracts of a plan's
// parameters and entry points. Header-only and dependency-free, so that the dialect, the compiler
// passes and the runtime share one spelling.
#pragma once

#include <string_view>

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

// The run state of inference plans (docs/inference-plan.md): the K/V cache "cache/k.<layer>" and
// "cache/v.<layer>", and "generate/self_conditioning_logits". Non-trainable parameters that the
// entries assign; like gradient buffers they are no weights: zero when a session opens, never read
// from or written to a checkpoint.
inline constexpr const char* kCachePrefix = "cache/";
inline constexpr const char* kGenerationStatePrefix = "generate/";

// Whether parameter `name` is one of the above.
inline bool isRunState(std::string_view name) {
  return name.substr(0, std::string_view(kCachePrefix).size()) == kCachePrefix ||
         name.substr(0, std::string_view(kGenerationStatePrefix).size()) == kGenerationStatePrefix;
}

}  // namespace dgemma
