// Emits DiffusionGemma as dg IR from its configuration (docs/model.md): the causal
// prompt encoder, the decoder over [prefix K/V ; canvas], the self-conditioning block, the tied and
// soft-capped head; and the block-diffusion training step (docs/training.md, "The objective"). One
// entry point per prompt-length bucket.
#ifndef MODELS_DIFFUSION_GEMMA_BUILDER_H
#define MODELS_DIFFUSION_GEMMA_BUILDER_H

#include <optional>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "models/diffusion_gemma/spec/Config.h"

namespace mlir::dg {

// How the model computes (docs/training.md, "Mixed precision"). Fp32: everything f32. Bf16 (mixed): parameters stay f32
// masters in the plan and every use casts them to bf16; activations and GEMM inputs are bf16; the
// fp32 islands are explicit casts: the router (logits, softmax, routing weights), the
// self-conditioning softmax, the head output and soft-cap, and the loss. Ops on bf16 tensors compute
// in f32 and round their results once (RMSNorm, attention softmax and RoPE run in f32 inside their op).
// The gradients of a parameter's uses are summed in f32 after autodiff (dg-f32-gradient-accumulation).
enum class Precision { Fp32, Bf16 };

std::optional<Precision> parsePrecision(const std::string& name);  // "fp32" | "bf16"
const char* precisionName(Precision precision);

struct DiffusionGemmaForwardOptions {
  int64_t microBatch = 1;
  std::vector<int64_t> promptLengths;  // one entry point per length
  Precision precision = Precision::Fp32;
  // I >= 1 (a config with a vision_config) adds "forward_images" beside each "forward".
  int64_t imagesPerExample = 0;
};

// The image inputs every image twin ("forward_images", "train_step_images", "prefill_images") adds to
// its text entry's (docs/model.md, "Image entries"), with N = B·I images (example b owns images
// [b·I, (b+1)·I)), T = vision_soft_tokens_per_image, N_p = T·k², D_p = 3·p²:
//   pixel_values [N, N_p, D_p] f32, image_position_ids [N, N_p, 2] i64, and the host-derived
//   image_pool_slot [N, N_p], image_token_index [B, P], image_segment_ids [B, P] i64
//   (runtime/data/batch/ImageInputs.h). The twin's bucket is its text entry's plus
//   images_per_example I and image_patches N_p. Throws InputError for I < 0, or I >= 1 without a
//   vision_config.
void checkImagesPerExample(const dgemma::DiffusionGemmaConfig& config, int64_t imagesPerExample);

// Entry "forward" (bucket: micro_batch, prompt_len, canvas_len), the contract of `dgemma-run
// forward` (docs/cli.md):
//   inputs   input_ids [B, P] i64, attention_mask [B, P] i64 (1 = real token, left padding 0),
//            noisy_canvas_ids [B, L] i64, self_conditioning_logits [B, L, V] f32,
//            self_conditioning_mask [B] f32 (0 gives exactly no signal);
//   outputs  logits [B, L, V] f32 (soft-capped), encoder_hidden [B, P, H] f32 (final-norm output of
//            the encoder), and encoder_k.<layer> / encoder_v.<layer> [B, P, Hkv, D]: the K/V the
//            decoder reads.
// "forward_images" (bucket: those plus images_per_example, image_patches): the image inputs too;
//   the prompt's image soft tokens take the projected vision features. Extra outputs
//   vision_features [N·T, H] f32 (every pooled slot's projected feature; image_token_index names
//   the rows the prompt reads) and encoder_input [B, P, H] f32 (the merged encoder input).
// Parameters carry their canonical HF names (model.decoder.…); the encoder and the decoder use the
// same tensors. Inputs, outputs and parameters are f32 in either precision.
OwningOpRef<ModuleOp> buildDiffusionGemmaForward(MLIRContext& context, const dgemma::DiffusionGemmaConfig& config,
                                                 const DiffusionGemmaForwardOptions& options);

// The training objective's settings (docs/training.md, "The objective"; defaults are Megatron Bridge's provider
// values except the self-conditioning probability, whose recipe value the presets set).
struct DiffusionGemmaObjective {
  enum class Variant { BaseSft, ReweightedCe, LooCe, ReweightedLooCe };
  Variant variant = Variant::BaseSft;
  std::optional<double> weightClip;  // w <- min(w, clip) for the reweighted variants
  double selfConditioningProb = 0.0;  // > 0 builds the detached pass 1
  double decoderLossWeight = 1.0;
  double encoderLossWeight = 1.0;  // > 0 builds the clean-target encoder pass
  double routerAuxLossCoeff = 0.0;  // > 0 adds the switch load-balancing loss of every pass-2 MoE call
  double noiseMin = 1e-3, noiseMax = 1.0 - 1e-3;
  // Grpo (docs/rl.md): train_step is the clipped policy-gradient loss over the estimate above, and
  // a "logps" entry gives the estimate alone.
  enum class PolicyLoss { None, Grpo };
  PolicyLoss policyLoss = PolicyLoss::None;
  double clipEpsilon = 0.2;  // the ratio's clip range [1 - ε, 1 + ε]
  // The two-sided clip: a negative advantage's ratio above δ counts as δ, without a gradient.
  std::optional<double> clipDelta;
  double klCoeff = 0.0;  // β > 0 adds the k3 KL penalty against ref_logps
};

// Parses an objective name (docs/training.md, "The four objectives"; "loo-reweighted-ce" is an alias); nullopt if unknown.
std::optional<DiffusionGemmaObjective::Variant> parseObjectiveVariant(const std::string& name);
const char* objectiveVariantName(DiffusionGemmaObjective::Variant variant);

struct DiffusionGemmaTrainOptions {
  int64_t microBatch = 1;
  std::vector<int64_t> promptLengths;  // one train_step entry per length
  DiffusionGemmaObjective objective;
  Precision precision = Precision::Fp32;
  int64_t imagesPerExample = 0;  // I >= 1 adds "train_step_images" beside each "train_step"
  // The routed experts take their tokens sequence-major ([S·B, H] rather than [B·S, H]), the same
  // arithmetic per token: under context parallelism the sequence's split is then the major part of
  // the tokens' dimension and survives the experts' gather over the expert group
  // (docs/parallelism.md, "Context parallelism").
  bool sequenceMajorExpertTokens = false;
};

// Two kinds of entry points:
//   "corrupt" (bucket: micro_batch, canvas_len): uniform-state corruption as IR (docs/training.md, "Uniform-state corruption", "Self-conditioning").
//       inputs   noise_keys [B, 2] i64 (one Philox key per example, see runtime/core/NoiseKeys.h),
//                canvas_ids [B, L] i64, canvas_mask [B, L] f32;
//       outputs  diffusion_t [B] f32, noisy_canvas_ids [B, L] i64, self_conditioning_mask [B] f32.
//       Each example's draws depend only on its key: t (stream 0), the selection uniforms (stream
//       1), the replacement ids (stream 2) and the self-conditioning coin (stream 3).
//   "train_step" (bucket: micro_batch, prompt_len, canvas_len): the objective of one micro-batch.
//       inputs   input_ids, attention_mask, canvas_ids, canvas_mask, and the corruption outputs above
//                (or a parity test's injected values);
//       outputs  loss [] f32 = (dec_w Σ_b ℓ_b + enc_w enc_loss B) / B (+ aux), diffusion_loss = Σ_b ℓ_b / B,
//                encoder_loss (when enc_w > 0); after dg-autodiff also grad/<parameter name>.
//       With the GRPO policy loss (docs/rl.md): inputs also advantages, old_logps and (β > 0)
//       ref_logps [B] f32; outputs loss [] (the clipped surrogate, + aux), logps, clipped and
//       (β > 0) kl [B] f32.
//   "logps" (a GRPO plan's; bucket and inputs those of train_step without the GRPO ones): outputs
//       logps [B] f32 only, so nothing differentiates it.
//   "train_step_images" and "logps_images" (bucket: those plus images_per_example, image_patches): the image inputs
//       too. The vision tower runs once; its features feed the K/V pass and the clean encoder pass
//       (whose canvas part has no image token), so the vision parameters get both passes' gradient.
OwningOpRef<ModuleOp> buildDiffusionGemmaTrain(MLIRContext& context, const dgemma::DiffusionGemmaConfig& config,
                                               const DiffusionGemmaTrainOptions& options);

// A pre-training objective on packed documents (docs/pretraining.md, "Objectives"), chosen at compile
// time by --objective.
struct DiffusionGemmaPretrainingObjective {
  enum class Kind { Autoregressive, MaskedDiffusion, BlockDiffusion };
  Kind kind = Kind::Autoregressive;
  int64_t maskTokenId = -1;  // masked diffusion: the absorbing token's id, in [0, V)
  double maskEpsilon = 1e-3;  // masked diffusion: p_mask = (1 - ε) t + ε
  int64_t canvasLength = 0;  // block diffusion: the block (canvas) length L, dividing every S
  double noiseMin = 1e-3, noiseMax = 1.0 - 1e-3;  // block diffusion: t's range, as the SFT corruption's
  double routerAuxLossCoeff = 0.0;  // > 0 adds the switch load-balancing loss of every MoE call
};

// "autoregressive" | "masked-diffusion" | "block-diffusion"; nullopt for any other name.
std::optional<DiffusionGemmaPretrainingObjective::Kind> parsePretrainingObjective(const std::string& name);
const char* pretrainingObjectiveName(DiffusionGemmaPretrainingObjective::Kind kind);

struct DiffusionGemmaPretrainingOptions {
  int64_t microBatch = 1;
  std::vector<int64_t> sequenceLengths;  // one train_step entry per packed length S
  DiffusionGemmaPretrainingObjective objective;
  Precision precision = Precision::Fp32;
};

// One entry point per packed length S (docs/pretraining.md, "Objectives"):
//   "train_step" (bucket: micro_batch, seq_len; block diffusion also canvas_len): the objective of one
//       micro-batch of packed rows.
//       inputs   input_ids [B, S] i64, position_ids [B, S] i64 (restarting at 0 in every document),
//                document_ids [B, S] i64 (equal within a document, different across; padding carries
//                an id of its own), and
//                - autoregressive: labels [B, S] i64 (the next token, any id in [0, V) where not
//                  scored) and loss_mask [B, S] f32 (1 where the label is a real next token of the
//                  same document);
//                - masked and block diffusion: loss_mask [B, S] f32 (1 on real tokens, 0 on padding) and
//                  noise_keys [B, 2] i64 (one Philox key per row, runtime/core/NoiseKeys.h).
//       outputs  loss [] f32 (+ the router aux term); masked diffusion also p_mask [B] f32,
//                masked_input_ids [B, S] i64 and masked_positions [B, S] f32 (1 where masked); block
//                diffusion also diffusion_t [B, S/L] f32 and noisy_canvas_ids [B, S] i64;
//                after dg-autodiff also grad/<parameter name>.
//   Autoregressive: the text stack with the causal mask (sliding layers: the last W positions) within
//   each document, every key valid; loss = Σ loss_mask·CE(logits, labels) / max(Σ loss_mask, 1).
//   Masked diffusion: t ~ U(0, 1) per row (stream 0), p_mask = (1 − ε) t + ε, each real token masked
//   when its uniform (stream 1) is below p_mask, at least one per row with a real token (the one with
//   the smallest uniform); the text stack with the bidirectional mask (sliding layers: |i − j| ≤ W/2 + 1)
//   within each document over the real tokens; loss = Σ masked·CE / p_mask / max(Σ loss_mask, 1).
//   Block diffusion: the row is S/L blocks; t_{b,k} = noise_min + (noise_max − noise_min) u (stream 0,
//   element k), each real token replaced by a uniform id (stream 2) when its uniform (stream 1) is below
//   its block's t (the SFT corruption); a causal pass over the clean row gives every layer's K/V, and
//   block k runs the decoder over [the clean K/V of positions < kL ; its noisy block] within each
//   document; ℓ_{b,k} = Σ_block loss_mask·CE(logits, input_ids) / max(Σ_block loss_mask, 1), and
//   loss = Σ ℓ_{b,k} / max(#blocks holding a real token, 1).
// Throws InputError for a masked-diffusion objective whose mask token is outside [0, V) or whose ε
// is outside (0, 1), and for a block-diffusion one whose L does not divide every S or whose noise
// range is not 0 <= noise_min <= noise_max <= 1.
OwningOpRef<ModuleOp> buildDiffusionGemmaPretrain(MLIRContext& context, const dgemma::DiffusionGemmaConfig& config,
                                                  const DiffusionGemmaPretrainingOptions& options);

// The inference twin of buildDiffusionGemmaPretrain (docs/pretraining.md, "Sampling"), one entry per S:
//   "logits" (bucket: micro_batch, seq_len; symbol logits_s<S>): the objective's stack and head over
//       the ids as given (masked diffusion: with the mask tokens already in place; nothing is drawn).
//       inputs   input_ids, position_ids, document_ids [B, S] i64 as train_step's; masked diffusion
//                also loss_mask [B, S] f32 (1 on real tokens: the keys attention may read);
//       outputs  logits [B, S, V] f32, soft-capped.
//   The stack is train_step's own code path (causal, every key valid; or bidirectional over the real
//   tokens), so CE of these logits gives train_step's loss. Throws as buildDiffusionGemmaPretrain.
OwningOpRef<ModuleOp> buildDiffusionGemmaPretrainLogits(MLIRContext& context,
                                                        const dgemma::DiffusionGemmaConfig& config,
                                                        const DiffusionGemmaPretrainingOptions& options);

}  // namespace mlir::dg

#endif
