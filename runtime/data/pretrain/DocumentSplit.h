// Megatron's `--split 969,30,1`: weights that cut a source's documents into consecutive train,
// validation and test ranges (docs/pretraining.md, "Splits").
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

// megatron-core's rule (0.16.1): with w the weights divided by their sum and c their running sums
// (c_0 = 0, c_{k+1} = c_k + w_k, in double), part k is [round(c_k · D), round(c_{k+1} · D)) of D
// documents, rounding half to even as Python's round; a part of weight 0 is empty.
std::array<DocumentRange, 3> splitDocumentRanges(const SplitWeights& split, int64_t documents);

}  // namespace dgemma
