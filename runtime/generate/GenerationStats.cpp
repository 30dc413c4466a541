#include "runtime/generate/GenerationStats.h"

#include <algorithm>

namespace dgemma {

void GenerationStats::add(const GenerationResult& result, int64_t padId) {
  ++requests;
  newTokens += std::count_if(result.newTokens.begin(), result.newTokens.end(), [&](int64_t id) { return id != padId; });
  canvases += static_cast<int64_t>(result.stepsPerCanvas.size());
  decoderPasses += result.decoderPasses;
}

}  // namespace dgemma
