// libFuzzer target: a model config.json (models/diffusion_gemma/spec/Config.h), read as dgemma-compile
// reads it, with HF's post-processing and every range check.
#include <cstdint>

#include "fuzz/FuzzSupport.h"
#include "models/diffusion_gemma/spec/Config.h"

namespace {

// The parser under test.
void loadConfig(std::string_view bytes) {
  (void)dgemma::loadDiffusionGemmaConfig(dgemma::fuzz::writeScratchFile("config.json", bytes));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgemma::fuzz::expectCleanVerdict(dgemma::fuzz::asText(data, size), loadConfig);
  return 0;
}
