// Emits DiffusionGemma as dg IR from its configuration (../shared/reference/model.md): the causal
// prompt encoder, the decoder over [prefix K/V ; canvas], the self-conditioning block, the tied and
// soft-capped head. One entry point per prompt-length bucket.
#ifndef MODELS_DIFFUSION_GEMMA_BUILDER_H
#define MODELS_DIFFUSION_GEMMA_BUILDER_H

#include <vector>

#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OwningOpRef.h"
#include "models/diffusion_gemma/Config.h"

namespace mlir::dg {

struct DiffusionGemmaForwardOptions {
  int64_t microBatch = 1;
  std::vector<int64_t> promptLengths;  // one entry point per length
};

// Entry "forward" (bucket: micro_batch, prompt_len, canvas_len), the contract of `dgemma-run
// forward` (../shared/reference/cli.md):
//   inputs   input_ids [B, P] i64, attention_mask [B, P] i64 (1 = real token, left padding 0),
//            noisy_canvas_ids [B, L] i64, self_conditioning_logits [B, L, V] f32,
//            self_conditioning_mask [B] f32 (0 gives exactly no signal);
//   outputs  logits [B, L, V] f32 (soft-capped), encoder_hidden [B, P, H] f32 (final-norm output of
//            the encoder), and encoder_k.<layer> / encoder_v.<layer> [B, P, Hkv, D]: the K/V the
//            decoder reads.
// Parameters carry their canonical HF names (model.decoder.…); the encoder and the decoder use the
// same tensors. Everything is f32.
OwningOpRef<ModuleOp> buildDiffusionGemmaForward(MLIRContext& context, const dgemma::DiffusionGemmaConfig& config,
                                                 const DiffusionGemmaForwardOptions& options);

}  // namespace mlir::dg

#endif
