// What a finished canvas commits (docs/generation.md, "The algorithm": EOS), and the
// tokens-per-forward figure of a generation.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace dgemma {

// Applies the EOS rule to one row's newly denoised canvas in place and returns whether the row is
// finished after it. A row finished by an earlier canvas gets an all-pad canvas. Otherwise the row
// finishes if any of `eosIds` appears anywhere in the canvas; the tokens after the first EOS become
// `padId` and the EOS itself stays.
bool finalizeCanvas(std::span<int64_t> canvas, bool finishedBefore, std::span<const int64_t> eosIds, int64_t padId);

// transformers' tokens_per_forward: the new tokens that are not `padId` (wherever they are) over
// the decoder passes that counted for the row; 0 for a row without passes.
double tokensPerForward(std::span<const int64_t> newTokens, int64_t decoderPasses, int64_t padId);

}  // namespace dgemma
