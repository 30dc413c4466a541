// The block-diffusion training objective of DiffusionGemma (docs/training.md, "The objective") as dg
// ops: the "corrupt" entry (uniform-state corruption, the self-conditioning coin) and the
// "train_step" entry (the encoder's K/V pass, self-conditioning pass 1 without gradient, the
// denoising cross-entropy with its reweighting and leave-one-out variants, the clean-target encoder
// loss and the router's load-balancing loss). The entries' contracts are in Builder.h.
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
  // "train_step_images" twin.
  void buildTrainStep(int64_t promptLength, int64_t imagesPerExample = 0);

 private:
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
