// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3" (SC 2011). A counter-based generator is a pure function of (counter, key), so any element
// of a random tensor can be computed independently: on any thread, any backend, any rank, after any
// resume. docs/kernels.md ("Random numbers") fixes how tensors map elements onto counters.
#pragma once

#include <array>
#include <cstdint>

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
// of `stream` take part; random_uniform's factory keeps the attribute below 2^32.
constexpr PhiloxCounter philoxUniformBlock(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t block) {
  const PhiloxKey key = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  const PhiloxCounter counter = {static_cast<uint32_t>(block),
                                 static_cast<uint32_t>(block >> 32) ^ static_cast<uint32_t>(stream),
                                 static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  return philox4x32x10(counter, key);
}

// The top 24 bits scaled by 2^-24: exactly representable in f32 and never 1.0.
constexpr float philoxWordToUniform(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// Element `index` of the uniform tensor for (seed, stream, offset).
constexpr float philoxUniform(uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index) {
  return philoxWordToUniform(philoxUniformBlock(seed, stream, offset, index / 4)[index % 4]);
}

}  // namespace dgemma
