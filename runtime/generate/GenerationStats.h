// The figures a generation run reports (docs/generation.md, "dgemma-run generate"): tokens per
// second, denoising steps per canvas and tokens committed per step, over all its requests.
#pragma once

#include <cstdint>

#include "runtime/generate/Generator.h"

namespace dgemma {

struct GenerationStats {
  int64_t requests = 0;
  int64_t newTokens = 0;      // new tokens that are not pad (the EOS counts; the pads after it do not)
  int64_t canvases = 0;       // canvases denoised, over all requests
  int64_t decoderPasses = 0;  // denoising steps, over all requests
  double seconds = 0;         // wall time of the generation (the caller's clock)

  void add(const GenerationResult& result, int64_t padId);
  double tokensPerSecond() const { return seconds > 0 ? newTokens / seconds : 0; }
  double stepsPerCanvas() const { return canvases > 0 ? static_cast<double>(decoderPasses) / canvases : 0; }
  // transformers' tokens_per_forward over the whole run: new tokens per denoising step.
  double tokensPerStep() const { return decoderPasses > 0 ? static_cast<double>(newTokens) / decoderPasses : 0; }
};

}  // namespace dgemma
