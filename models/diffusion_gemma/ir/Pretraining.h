// The pre-training objectives of DiffusionGemma on packed documents (docs/pretraining.md, "Objectives")
// as dg ops: the autoregressive, masked-diffusion and block-diffusion "train_step" entries, and the
// "logits" entry that samples from an autoregressive or masked-diffusion model (docs/pretraining.md,
// "Sampling"). Their contracts are in Builder.h.
#ifndef MODELS_DIFFUSION_GEMMA_PRETRAINING_H
#define MODELS_DIFFUSION_GEMMA_PRETRAINING_H

#include "models/diffusion_gemma/ir/GraphBuilder.h"
#include "models/diffusion_gemma/ir/TextStack.h"

namespace mlir::dg::diffusion_gemma {

class PretrainingBuilder {
 public:
  PretrainingBuilder(GraphBuilder& graph, TextStack& text, const DiffusionGemmaPretrainingObjective& objective);

  // The body of the "train_step" entry for packed rows of `sequenceLength` tokens.
  void buildTrainStep(int64_t sequenceLength);
  // The body of the "logits" entry: the train step's stack and head over the ids as given, the
  // soft-capped logits out.
  void buildLogits(int64_t sequenceLength);

 private:
  // The stack of each objective, shared by its train step and its logits entry so that both compute
  // the same numbers: causal with every key valid, or bidirectional over the real tokens.
  Value autoregressiveHidden(Value inputIds, Value positions, Value documentIds, int64_t sequenceLength);
  Value maskedDiffusionHidden(Value inputIds, Value lossMask, Value positions, Value documentIds);
  // The loss of the autoregressive objective before the router aux term.
  Value autoregressiveLoss(Value inputIds, Value positions, Value documentIds, int64_t sequenceLength);
  // The loss of the masked-diffusion objective before the router aux term; writes p_mask,
  // masked_input_ids and masked_positions.
  Value maskedDiffusionLoss(Value inputIds, Value positions, Value documentIds, int64_t sequenceLength);
  // The loss of the uniform-state block-diffusion objective before the router aux term; writes
  // diffusion_t and noisy_canvas_ids.
  Value blockDiffusionLoss(Value inputIds, Value positions, Value documentIds, int64_t sequenceLength);
  // Σ weights · CE(head(hidden), targets) / max(Σ countedTokens, 1): CE of the soft-capped logits,
  // with the cap inside the cross-entropy so that [B, S, V] capped logits never exist.
  Value normalisedCrossEntropy(Value hidden, Value targets, Value weights, Value countedTokens,
                               const std::string& name);
  // The counter streams of one row's key (Builder.h).
  static constexpr int64_t kTimeStream = 0, kMaskStream = 1;
  // Block diffusion's streams are the SFT corruption's (Builder.h, "corrupt"): t, selection, replacement.
  static constexpr int64_t kSelectionStream = 1, kReplacementStream = 2;

  GraphBuilder& g_;
  TextStack& text_;
  const DiffusionGemmaPretrainingObjective& objective_;
  OpBuilder& b_;
  const dgemma::DiffusionGemmaConfig& config_;
  int64_t batch_;
  Type f32_;
};

}  // namespace mlir::dg::diffusion_gemma

#endif
