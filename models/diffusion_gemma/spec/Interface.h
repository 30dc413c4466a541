// The names DiffusionGemma's plans are built with and run by: entry points, their input fields and
// outputs, and bucket dimensions. One spelling shared by the IR builders (ir/) and the runtime's
// model adapter (runtime/model/diffusion_gemma), so neither side can drift from the other; nothing
// else in the runtime or the tools names them (docs/architecture.md, "The model boundary").
// Header-only and dependency-free.
#pragma once

namespace dgemma::diffusion_gemma {

// Entry points (docs/training.md, "The objective"; docs/inference-plan.md). A bucketed entry's
// function is named "<entry>_p<prompt length>"; "<entry>_images" is the image twin of an entry
// (dgemma-compile --images-per-example).
inline constexpr const char* kForwardEntry = "forward";
inline constexpr const char* kForwardImagesEntry = "forward_images";
inline constexpr const char* kCorruptEntry = "corrupt";
inline constexpr const char* kTrainStepEntry = "train_step";
inline constexpr const char* kTrainStepImagesEntry = "train_step_images";
// A GRPO plan's (docs/rl.md): the policy's log-probability estimate of a batch, no loss, no gradient.
inline constexpr const char* kLogpsEntry = "logps";
inline constexpr const char* kLogpsImagesEntry = "logps_images";
inline constexpr const char* kPrefillEntry = "prefill";
inline constexpr const char* kPrefillImagesEntry = "prefill_images";
inline constexpr const char* kDenoiseEntry = "denoise";
inline constexpr const char* kDenoiseFirstEntry = "denoise_first";
inline constexpr const char* kCommitEntry = "commit";
// A pre-training inference plan's (docs/pretraining.md, "Sampling"): the soft-capped logits of packed
// rows through the pre-training objective's stack. Its function is named "logits_s<seq_len>".
inline constexpr const char* kPackedLogitsEntry = "logits";

// Bucket dimensions of the entries (docs/plan-format.md, "Header").
inline constexpr const char* kMicroBatchDimension = "micro_batch";
inline constexpr const char* kPromptLengthDimension = "prompt_len";
inline constexpr const char* kCanvasLengthDimension = "canvas_len";
inline constexpr const char* kSequenceLengthDimension = "seq_len";  // a pre-training train_step's packed length

// The collated batch (docs/data.md, "Collated batch"): the prompt as HF's processor gives it, and
// the canvas with the mask of its scored positions.
inline constexpr const char* kInputIds = "input_ids";
inline constexpr const char* kAttentionMask = "attention_mask";
inline constexpr const char* kPositionIds = "position_ids";
inline constexpr const char* kTokenTypeIds = "mm_token_type_ids";
inline constexpr const char* kCanvasIds = "canvas_ids";
inline constexpr const char* kCanvasMask = "canvas_mask";

// Images (docs/data.md, "Image preprocessing"): the processor's patches and patch positions, and
// the plan inputs derived from them (runtime/data/batch/ImageInputs.h).
inline constexpr const char* kPixelValues = "pixel_values";
inline constexpr const char* kImagePositionIds = "image_position_ids";
inline constexpr const char* kImagePoolSlot = "image_pool_slot";
inline constexpr const char* kImageTokenIndex = "image_token_index";
inline constexpr const char* kImageSegmentIds = "image_segment_ids";

// Corruption and self-conditioning (docs/training.md, "Uniform-state corruption",
// "Self-conditioning"): corrupt's inputs and outputs, train_step's and forward's inputs.
inline constexpr const char* kNoiseKeys = "noise_keys";
inline constexpr const char* kNoisyCanvasIds = "noisy_canvas_ids";
inline constexpr const char* kDiffusionTime = "diffusion_t";
inline constexpr const char* kSelfConditioningMask = "self_conditioning_mask";
inline constexpr const char* kSelfConditioningLogits = "self_conditioning_logits";

// train_step's outputs (docs/training.md, "The objective") besides the gradients.
inline constexpr const char* kLoss = "loss";
inline constexpr const char* kDiffusionLoss = "diffusion_loss";
inline constexpr const char* kEncoderLoss = "encoder_loss";

// A pre-training plan's train_step inputs and outputs (docs/pretraining.md, "Objectives"): packed
// documents with their ids, the autoregressive labels, the scored positions, and the masked-diffusion
// draws.
inline constexpr const char* kDocumentIds = "document_ids";
inline constexpr const char* kLabels = "labels";
inline constexpr const char* kLossMask = "loss_mask";
inline constexpr const char* kMaskProbability = "p_mask";
inline constexpr const char* kMaskedInputIds = "masked_input_ids";
inline constexpr const char* kMaskedPositions = "masked_positions";

// A GRPO plan's train_step inputs and outputs besides the SFT ones, and the logps entry's output
// (docs/rl.md): [B] f32 each.
inline constexpr const char* kAdvantages = "advantages";
inline constexpr const char* kOldLogps = "old_logps";
inline constexpr const char* kRefLogps = "ref_logps";
inline constexpr const char* kLogps = "logps";
inline constexpr const char* kClipped = "clipped";
inline constexpr const char* kKlTerm = "kl";

// forward's outputs (docs/model.md).
inline constexpr const char* kLogits = "logits";
inline constexpr const char* kEncoderHidden = "encoder_hidden";
inline constexpr const char* kEncoderInput = "encoder_input";
inline constexpr const char* kVisionFeatures = "vision_features";

// The inference entries' fields (docs/inference-plan.md).
inline constexpr const char* kPositions = "positions";
inline constexpr const char* kBlockIds = "block_ids";
inline constexpr const char* kCacheValid = "cache_valid";
inline constexpr const char* kFrozen = "frozen";
// prefill's and commit's [B] f32: the rows whose cache the call writes (the others keep theirs).
inline constexpr const char* kWriteRows = "write_rows";
inline constexpr const char* kTemperature = "temperature";
inline constexpr const char* kSampleKeys = "sample_keys";
inline constexpr const char* kSampledIds = "sampled_ids";
inline constexpr const char* kArgmaxIds = "argmax_ids";
inline constexpr const char* kEntropy = "entropy";
// prefill's outputs that grow with the prompt bucket (cropped back after bucket padding).
inline constexpr const char* kEncoderKeyPrefix = "encoder_k.";
inline constexpr const char* kEncoderValuePrefix = "encoder_v.";

}  // namespace dgemma::diffusion_gemma
