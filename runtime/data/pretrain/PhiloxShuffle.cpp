#include "runtime/data/pretrain/PhiloxShuffle.h"

#include <utility>

#include "runtime/core/Philox.h"

namespace dgemma {

uint64_t philoxBelow(uint64_t seed, ShufflePurpose purpose, uint32_t epoch, uint64_t draw, uint64_t bound) {
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  for (uint32_t attempt = 0;; ++attempt) {
    const PhiloxCounter counter = {static_cast<uint32_t>(draw), static_cast<uint32_t>(draw >> 32), epoch,
                                   (static_cast<uint32_t>(purpose) << 24) | (attempt & 0xFFFFFFu)};
    const PhiloxCounter words = philox4x32x10(counter, key);
    const uint64_t value = static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
    const unsigned __int128 product = static_cast<unsigned __int128>(value) * bound;
    const uint64_t low = static_cast<uint64_t>(product);
    // (-bound) % bound is 2^64 mod bound; most draws are accepted without computing it.
    if (low >= bound || low >= (0 - bound) % bound) return static_cast<uint64_t>(product >> 64);
  }
}

void philoxShuffle(std::vector<int64_t>& values, uint64_t seed, ShufflePurpose purpose, uint32_t epoch) {
  const uint64_t n = values.size();
  for (uint64_t i = n; i-- > 1;) {
    const uint64_t j = philoxBelow(seed, purpose, epoch, n - 1 - i, i + 1);
    std::swap(values[i], values[j]);
  }
}

}  // namespace dgemma
