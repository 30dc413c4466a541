// Entropy-bound acceptance (docs/generation.md, "The algorithm"): which canvas positions
// take the decoder's new sample at a denoising step; the others are renoised.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dgemma {

// Positions ordered by entropy, ascending, ties in position order (a stable sort); a position is
// accepted when the entropy of the positions before it in that order sums to at most `bound`, so
// the lowest-entropy position is always accepted. The sum is taken as transformers takes it on the
// CPU: the inclusive prefix sums accumulated in double and rounded to f32 one by one, minus the
// position's own entropy in f32, compared with `bound` rounded to f32. One byte per position, 1 for
// accepted.
std::vector<uint8_t> entropyBoundAccept(std::span<const float> entropy, double bound);

}  // namespace dgemma
