// The block-diffusion training objective of DiffusionGemma (docs/training.md, "The objective") as dg
// ops: the "corrupt" entry (uniform-state corruption, the self-conditioning coin) and the
// "train_step" entry (the encoder's K/V pass, self-conditioning pass 1 without gradient, the
// denoising cross-entropy with its reweighting and leave-one-out variants, the clean-target encoder
// loss and the router's load-balancing loss), or GRPO's "train_step" and "logps" over the same
// estimate (docs/rl.md). The entries' contracts are in Builder.h.
#ifndef MODELS_DIFFUSION_GEMMA_OBJECTIVE_H
#define MODELS_DIFFUSION_GEMMA_OBJECTIVE_H

#include <string>

#include "models/diffusion_gemma/ir/GraphBuilder.h"
#include "models/diffusion_gemma/ir/TextStack.h"

namespace mlir::dg::diffusion_gemma {

class ObjectiveBuilder {
 public:
  ObjectiveBuilder(GraphBuilder& graph, TextStack& text, const DiffusionGemmaObjective& objective);

  // The body of the "corrupt" entry.
  void buildCorrupt();
  // The body of a "train_step" entry for prompts of `promptLength`; with imagesPerExample >= 1 the
  // "train_step_images" twin. The objective's policy loss chooses SFT or GRPO (docs/rl.md).
  void buildTrainStep(int64_t promptLength, int64_t imagesPerExample = 0);
  // The body of a GRPO plan's "logps" entry (or its "logps_images" twin): train_step's
  // log-probability estimate alone, with no loss for dg-autodiff to differentiate.
  void buildLogps(int64_t promptLength, int64_t imagesPerExample = 0);

 private:
  enum class StepOutputs { Objective, LogpsOnly };
  // train_step and logps share everything up to the per-example masked cross-entropy and w(t).
  void buildStep(int64_t promptLength, int64_t imagesPerExample, StepOutputs outputs);
  // w(t) of the reweighted variants: 1 / max(1 − t, 1e-12), clipped if configured.
  Value exampleWeight(Value diffusionTime);
  // The GRPO loss over logps [B] (docs/rl.md, "The GRPO loss"): declares its inputs, writes the
  // logps, clipped and kl outputs, and returns the loss before the router aux term.
  Value policyLoss(Value logps);
  // The counter streams of one example's key (Builder.h).
  static constexpr int64_t kTimeStream = 0, kSelectionStream = 1, kReplacementStream = 2, kSelfConditioningStream = 3;

  Value crossEntropy(Value logits, Value targets, Value bonusIds, Value bonus, const std::string& name, bool capped);
  Value uniform(Value keys, int64_t stream, ArrayRef<int64_t> shape, const std::string& name);

  GraphBuilder& g_;
  TextStack& text_;
  const DiffusionGemmaObjective& objective_;
  OpBuilder& b_;
  const dgemma::DiffusionGemmaConfig& config_;
  int64_t batch_, canvasLength_, hidden_;
  Type f32_;
};

}  // namespace mlir::dg::diffusion_gemma

#endif
