// The inference entry points of DiffusionGemma (docs/inference-plan.md): `prefill` encodes a prompt
// into the K/V cache, `denoise` runs one decoder step over [cache ; canvas] and the fused sampler,
// `commit` encodes an accepted canvas and appends its K/V. The cache and the previous step's
// temperature-scaled logits are run state (non-trainable parameters the entries assign), so a
// generation loop moves no tensor of size cache or vocabulary between the host and the device.
#ifndef MODELS_DIFFUSION_GEMMA_INFERENCE_H
#define MODELS_DIFFUSION_GEMMA_INFERENCE_H

#include <cstdint>
#include <string>
#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/spec/Config.h"

namespace mlir::dg {

// The run-state parameters' names: cache/k.<layer>, cache/v.<layer> and
// generate/self_conditioning_logits. Checkpoints never hold them; they start at zero.
std::string cacheKeysName(int64_t layer);
std::string cacheValuesName(int64_t layer);
inline constexpr const char* kSelfConditioningStateName = "generate/self_conditioning_logits";

// C, the full-attention layers' cache slots: the largest prompt bucket plus every canvas but the
// last, which is never encoded: maxPrompt + ceil(maxNewTokens / L) * L - L.
int64_t inferenceCacheLength(int64_t maxPromptLength, int64_t maxNewTokens, int64_t canvasLength);
// C_l: C on full layers; min(C, W - 1) on sliding ones, the most that a decoder query or the first
// query of a committed block can see.
int64_t layerCacheLength(const dgemma::DiffusionGemmaConfig& config, int64_t layer, int64_t cacheLength);

struct DiffusionGemmaInferenceOptions {
  int64_t microBatch = 1;
  std::vector<int64_t> promptLengths;  // one forward and one prefill entry per length
  Precision precision = Precision::Fp32;
  int64_t cacheLength = 0;  // C, from inferenceCacheLength
  int64_t imagesPerExample = 0;  // I >= 1 adds "forward_images" and "prefill_images" per length
};

// The forward entries of buildDiffusionGemmaForward and, with B = micro_batch, L = canvas_length:
//   "prefill" (bucket: micro_batch, prompt_len P)
//       inputs   input_ids, attention_mask, positions [B, P] i64 (left padding: mask 0);
//       effect   cache/{k,v}.<l> := the last C_l of the prompt's K/V, zeros on the left if P < C_l.
//   "prefill_images" (bucket: those plus images_per_example, image_patches): "prefill" with the
//       image inputs of Builder.h; the prompt's image soft tokens take the vision features.
//   "denoise" (bucket: micro_batch)
//       inputs   canvas_ids [B, L] i64, cache_valid [B, C] i64, positions [B, L] i64,
//                self_conditioning_mask, frozen, temperature [B] f32, sample_keys [B, 2] i64;
//       outputs  sampled_ids, argmax_ids [B, L] i64, entropy [B, L] f32 (dg.canvas_sample of the
//                logits at that temperature);
//       effect   generate/self_conditioning_logits := the step's z = logits / T, except on frozen rows.
//   "denoise_first" (bucket: micro_batch)
//       "denoise" with self_conditioning_mask 0 on every row (a canvas's first step), without that
//       input and without the self-conditioning work a zero mask makes exactly nothing.
//   "commit" (bucket: micro_batch)
//       inputs   block_ids [B, L] i64, cache_valid [B, C] i64 (before this block), positions [B, L] i64;
//       effect   cache/{k,v}.<l> := the last C_l slots of [cache ; the block's causal K/V].
OwningOpRef<ModuleOp> buildDiffusionGemmaInference(MLIRContext& context, const dgemma::DiffusionGemmaConfig& config,
                                                   const DiffusionGemmaInferenceOptions& options);

}  // namespace mlir::dg

#endif
