#include "runtime/generate/EntropyBoundAcceptance.h"

#include <algorithm>
#include <numeric>

namespace dgemma {

std::vector<uint8_t> entropyBoundAccept(std::span<const float> entropy, double bound) {
  std::vector<int64_t> order(entropy.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return entropy[a] < entropy[b]; });
  const float boundF32 = static_cast<float>(bound);
  std::vector<uint8_t> accepted(entropy.size(), 0);
  double running = 0;
  for (int64_t position : order) {
    running += entropy[position];
    // (inclusive sum) - (own entropy): what torch computes, which may round differently from the
    // exclusive sum itself.
    const float before = static_cast<float>(running) - entropy[position];
    accepted[position] = before <= boundF32 ? 1 : 0;
  }
  return accepted;
}

}  // namespace dgemma
