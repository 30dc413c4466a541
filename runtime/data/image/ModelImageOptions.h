// The image processor options of a model (docs/data.md, "Image preprocessing"): its vision_config's
// patch and pooling sizes and its vision_soft_tokens_per_image (CONTRACT of the image plans: the
// pipeline's Gemma4ImageOptions = {p, k, T}). Header-only: its users link the config library.
#pragma once

#include "models/diffusion_gemma/Config.h"
#include "runtime/data/image/Image.h"

namespace dgemma {

inline Gemma4ImageOptions imageOptionsOf(const DiffusionGemmaConfig& config) {
  Gemma4ImageOptions options;
  options.patchSize = config.vision.patchSize;
  options.poolingKernelSize = config.vision.poolingKernelSize;
  options.maxSoftTokens = config.maxSoftTokensPerImage;
  options.configuredSoftTokens = true;
  return options;
}

}  // namespace dgemma
