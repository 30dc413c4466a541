// The randomness of generation (docs/generation.md, "Randomness"): every draw is a pure function of
// (run seed, request id, canvas, denoising step, purpose), so a request's text is the same whatever
// batch it runs in, its row in the batch, or what ran before it.
#pragma once

#include <array>
#include <cstdint>

#include "runtime/core/Philox.h"

namespace dgemma {

// What a draw is for. The purpose keeps the streams of one (request, canvas, step) apart.
enum class DrawPurpose : uint32_t {
  InitialCanvas = 0,  // the uniform canvas a block starts from (step 0)
  Renoise = 1,        // the uniform ids of the positions a step rejects
  Sample = 2,         // the key of the categorical draw dg.canvas_sample makes on the device
};

// Denoising steps are counted from 0 within a canvas and must stay below 2^24.
inline constexpr uint64_t kMaxKeyedSteps = uint64_t{1} << 24;

// The 64-bit seed of one draw: Philox4x32-10 under the run seed of the counter (request id, canvas,
// 0x40000000 | purpose << 24 | step). Bit 30 of the last word is clear in every training noise key's
// counter (runtime/core/NoiseKeys.h), so generation never reuses a training key of the same seed.
inline uint64_t generationDrawSeed(uint64_t runSeed, uint64_t requestId, uint64_t canvas, uint64_t step,
                                   DrawPurpose purpose) {
  const PhiloxKey key = {static_cast<uint32_t>(runSeed), static_cast<uint32_t>(runSeed >> 32)};
  const PhiloxCounter counter = {static_cast<uint32_t>(requestId), static_cast<uint32_t>(requestId >> 32),
                                 static_cast<uint32_t>(canvas),
                                 0x40000000u | (static_cast<uint32_t>(purpose) << 24) | static_cast<uint32_t>(step)};
  const PhiloxCounter words = philox4x32x10(counter, key);
  return static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
}

// The sample_keys row of the denoise entry: (seed, counter offset 0) as the device's keyed random
// ops read a key (docs/kernels.md, "Random numbers").
inline std::array<int64_t, 2> sampleKey(uint64_t runSeed, uint64_t requestId, uint64_t canvas, uint64_t step) {
  return {static_cast<int64_t>(generationDrawSeed(runSeed, requestId, canvas, step, DrawPurpose::Sample)), 0};
}

// Id `position` of the uniform canvas of (runSeed, request, canvas, step, purpose): uniform over
// [0, vocabSize) without modulo bias (philoxInt's rejection), position-addressable.
inline int64_t uniformTokenId(uint64_t runSeed, uint64_t requestId, uint64_t canvas, uint64_t step, DrawPurpose purpose,
                              uint64_t position, uint64_t vocabSize) {
  return philoxInt(generationDrawSeed(runSeed, requestId, canvas, step, purpose), /*stream=*/0, /*offset=*/0, position,
                   vocabSize);
}

}  // namespace dgemma
