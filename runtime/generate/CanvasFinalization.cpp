#include "runtime/generate/CanvasFinalization.h"

#include <algorithm>

namespace dgemma {

bool finalizeCanvas(std::span<int64_t> canvas, bool finishedBefore, std::span<const int64_t> eosIds, int64_t padId) {
  if (finishedBefore) {
    std::fill(canvas.begin(), canvas.end(), padId);
    return true;
  }
  auto isEos = [&](int64_t id) { return std::find(eosIds.begin(), eosIds.end(), id) != eosIds.end(); };
  auto firstEos = std::find_if(canvas.begin(), canvas.end(), isEos);
  if (firstEos == canvas.end()) return false;
  std::fill(firstEos + 1, canvas.end(), padId);
  return true;
}

double tokensPerForward(std::span<const int64_t> newTokens, int64_t decoderPasses, int64_t padId) {
  if (decoderPasses == 0) return 0;
  const auto tokens = std::count_if(newTokens.begin(), newTokens.end(), [&](int64_t id) { return id != padId; });
  return static_cast<double>(tokens) / static_cast<double>(decoderPasses);
}

}  // namespace dgemma
