// libFuzzer target: a generation_config.json beside a model (models/diffusion_gemma/spec/GenerationConfig.h),
// found and read as dgemma-run generate finds it.
#include <cstdint>

#include "fuzz/FuzzSupport.h"
#include "models/diffusion_gemma/spec/GenerationConfig.h"

namespace {

// The parser under test.
void loadGenerationConfig(std::string_view bytes) {
  dgemma::fuzz::writeScratchFile("generation_config.json", bytes);
  (void)dgemma::loadGenerationConfigBeside(dgemma::fuzz::scratchDirectory());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), loadGenerationConfig);
  return 0;
}
