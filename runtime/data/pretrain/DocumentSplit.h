// Megatron's `--split 969,30,1`: weights that cut a source's documents into consecutive train,
// validation and test ranges (docs/pretraining-packing.md, "Splits").
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace dgemma {

enum class SplitPart { Train = 0, Validation = 1, Test = 2 };

// "train", "validation", "test".
const char* splitPartName(SplitPart part);

// The three weights, as written (not normalized); at least one is above 0.
struct SplitWeights {
  std::array<double, 3> weights = {1, 0, 0};
};

// Documents [begin, end) of a source.
struct DocumentRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Parses "969,30,1" (or "969/30/1"): one to three numbers >= 0, missing ones 0, sum > 0. Throws
// InputError "--split: item 2 ('x'): expected a number >= 0" and the like.
SplitWeights parseSplit(const std::string& text);
// "969,30,1" again, for messages and cache keys (shortest round-trip form of each weight).
std::string formatSplit(const SplitWeights& split);

// Megatron's rule: with w the weights divided by their sum and D documents, boundary k+1 = boundary k
// + round_half_even(w_k · D) (in double), then every boundary but the first is moved by the same
// amount so the last is D (the train part absorbs the rounding); a boundary shifted below 0 is 0.
std::array<DocumentRange, 3> splitDocumentRanges(const SplitWeights& split, int64_t documents);

}  // namespace dgemma
