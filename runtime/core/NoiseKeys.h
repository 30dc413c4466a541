// Per-example noise keys (docs/training.md, "Noise keys"). Every random draw of a training
// example (its diffusion time, the corruption, the self-conditioning coin) comes from one Philox key
// that is a pure function of (run seed, phase, step, global sample index). A sample's noise is then
// the same whatever its micro-batch position, the micro-batch size or the data-parallel size, resume
// needs no generator state, and an evaluation pass (phase 1) never shifts training noise (phase 0).
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/core/HostTensor.h"
#include "runtime/core/Philox.h"

namespace dgemma {

enum class NoisePhase : uint32_t { Train = 0, Eval = 1 };

// The key of one example: Philox itself mixes (sample index, step, phase) under the run seed, so
// nearby indices or steps give unrelated keys. Steps are below 2^63 (the top bit holds the phase).
// The second word is the counter offset the corruption ops start from (always 0).
inline std::array<int64_t, 2> noiseKey(uint64_t runSeed, NoisePhase phase, uint64_t step, uint64_t sampleIndex) {
  const PhiloxKey key = {static_cast<uint32_t>(runSeed), static_cast<uint32_t>(runSeed >> 32)};
  const PhiloxCounter counter = {static_cast<uint32_t>(sampleIndex), static_cast<uint32_t>(sampleIndex >> 32),
                                 static_cast<uint32_t>(step),
                                 static_cast<uint32_t>(step >> 32) ^ (static_cast<uint32_t>(phase) << 31)};
  const PhiloxCounter words = philox4x32x10(counter, key);
  const uint64_t exampleSeed = static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
  return {static_cast<int64_t>(exampleSeed), 0};
}

// The [B, 2] i64 noise keys input of the plan's corrupt entry (docs/training.md, "Noise keys") for
// the examples with these global sample indices.
inline HostTensor noiseKeys(uint64_t runSeed, NoisePhase phase, uint64_t step, const std::vector<int64_t>& sampleIndices) {
  HostTensor keys(DType::I64, {static_cast<int64_t>(sampleIndices.size()), 2});
  for (size_t row = 0; row < sampleIndices.size(); ++row) {
    const std::array<int64_t, 2> key = noiseKey(runSeed, phase, step, static_cast<uint64_t>(sampleIndices[row]));
    keys.as<int64_t>()[2 * row] = key[0];
    keys.as<int64_t>()[2 * row + 1] = key[1];
  }
  return keys;
}

}  // namespace dgemma
