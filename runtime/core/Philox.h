// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3" (SC 2011). A counter-based generator is a pure function of (counter, key), so any element
// of a random tensor can be computed independently: on any thread, any backend, any rank, after any
// resume. docs/kernels.md ("Random numbers") fixes how tensors map elements onto counters.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace dgemma {

using PhiloxCounter = std::array<uint32_t, 4>;
using PhiloxKey = std::array<uint32_t, 2>;

// The ten-round bijection of the counter under the key.
constexpr PhiloxCounter philox4x32x10(PhiloxCounter counter, PhiloxKey key) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u;
  constexpr uint32_t kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kKeyIncrement0 = 0x9E3779B9u;  // golden ratio
  constexpr uint32_t kKeyIncrement1 = 0xBB67AE85u;  // sqrt(3) - 1
  constexpr int kRounds = 10;
  for (int round = 0; round < kRounds; ++round) {
    if (round > 0) {
      key[0] += kKeyIncrement0;
      key[1] += kKeyIncrement1;
    }
    const uint64_t product0 = static_cast<uint64_t>(kMultiplier0) * counter[0];
    const uint64_t product1 = static_cast<uint64_t>(kMultiplier1) * counter[2];
    counter = {static_cast<uint32_t>(product1 >> 32) ^ counter[1] ^ key[0], static_cast<uint32_t>(product1),
               static_cast<uint32_t>(product0 >> 32) ^ counter[3] ^ key[1], static_cast<uint32_t>(product0)};
  }
  return counter;
}

// The four words that serve elements 4*block ... 4*block+3 of a random tensor. Only the low 32 bits
// of `stream` take part; the random kernels' factories keep the attribute below 2^32.
constexpr PhiloxCounter philoxUniformBlock(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t block) {
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const PhiloxCounter counter = {static_cast<uint32_t>(block),
                                 static_cast<uint32_t>(block >> 32) ^ static_cast<uint32_t>(stream),
                                 static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  return philox4x32x10(counter, key);
}

// The 32-bit word of element `index` of a random tensor for (seed, stream, offset).
constexpr uint32_t philoxWord(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index) {
  return philoxUniformBlock(seed, stream, offset, index / 4)[index % 4];
}

// The top 24 bits scaled by 2^-24: exactly representable in f32 and never 1.0.
constexpr float philoxWordToUniform(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// Element `index` of the uniform tensor for (seed, stream, offset).
constexpr float philoxUniform(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index) {
  return philoxWordToUniform(philoxWord(seed, stream, offset, index));
}

// One 32-bit word mapped to [0, high), 1 <= high <= 2^32, with every value equally likely over the
// words it accepts. A power of two takes the low log2(high) bits (every word is accepted). Otherwise
// Lemire's multiply-shift: the high half of word * high, rejecting the words whose low half falls
// below 2^32 mod high, the surplus that would make some results one word more likely; nullopt then.
constexpr std::optional<uint32_t> philoxWordToInt(uint32_t word, uint64_t high) {
  if ((high & (high - 1)) == 0) return word & static_cast<uint32_t>(high - 1);
  const uint64_t product = static_cast<uint64_t>(word) * high;
  const uint32_t low = static_cast<uint32_t>(product);
  // 2^32 mod high is below high, so most words are accepted without computing it.
  if (low < high && low < (uint64_t{1} << 32) % high) return std::nullopt;
  return static_cast<uint32_t>(product >> 32);
}

// Element `index` of the integer tensor uniform in [0, high) for (seed, stream, offset). A rejected
// word is replaced by the same element's word under offset + 1, then offset + 2, and so on; a
// rejection has probability (2^32 mod high) / 2^32 < 1/2, so the loop ends.
constexpr uint32_t philoxInt(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index, uint64_t high) {
  for (uint64_t attempt = 0;; ++attempt)
    if (const std::optional<uint32_t> value = philoxWordToInt(philoxWord(seed, stream, offset + attempt, index), high))
      return *value;
}

}  // namespace dgemma
