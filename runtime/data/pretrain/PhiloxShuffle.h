// The seeded shuffles of the pre-training dataset (docs/pretraining.md, "Shuffles"): a
// Fisher–Yates pass whose draws are Philox4x32-10 words (runtime/core/Philox.h), so an order is a
// pure function of (seed, purpose, epoch) on every platform and standard library — unlike
// std::shuffle, whose use of the generator is left to the implementation.
#pragma once

#include <cstdint>
#include <vector>

namespace dgemma {

// Keeps the random streams of the two shuffles apart.
enum class ShufflePurpose : uint32_t { DocumentOrder = 1, SampleOrder = 2 };

// A draw uniform in [0, bound), 1 <= bound: the 64-bit value x = word0 | word1 << 32 of
// philox4x32x10(counter = {draw low, draw high, epoch, purpose << 24 | attempt}, key = {seed low,
// seed high}) mapped by Lemire's multiply-shift, floor(x · bound / 2^64), rejecting x whose low half
// of the product is below 2^64 mod bound (then attempt + 1). A rejection has probability
// below bound / 2^64, so for any dataset size it practically never happens.
uint64_t philoxBelow(uint64_t seed, ShufflePurpose purpose, uint32_t epoch, uint64_t draw, uint64_t bound);

// Fisher–Yates from the back: for i = n−1 down to 1, draw number n−1−i picks j in [0, i] and swaps
// values[i] with values[j].
void philoxShuffle(std::vector<int64_t>& values, uint64_t seed, ShufflePurpose purpose, uint32_t epoch);

}  // namespace dgemma
