// The mock dataset (docs/data.md, "Mock dataset"), for smoke tests only: deterministic random
// prompts and one of a few fixed "answer programs" per item, so that overfitting is measurable. Not
// evidence of quality.
#pragma once

#include <cstdint>

#include "runtime/data/batch/Blocks.h"

namespace dgemma {

struct MockDatasetOptions {
  int64_t promptLength = 32;       // text tokens after <bos>
  int64_t completionLength = 64;   // before EOS
  int64_t numDistinctAnswers = 4;
  int64_t tokenMin = 1000;         // token ids are drawn from [tokenMin, tokenMax)
  int64_t tokenMax = 20000;
  int64_t eosId = 1;
  int64_t bosId = 2;
  uint64_t seed = 1234;
  bool validation = false;         // validation items are train items shifted by kValidationOffset
};

inline constexpr int64_t kMockValidationOffset = 10'000'000;

// Item `index`: prompt = <bos> + promptLength random tokens (a function of seed and the shifted
// index); completion = answer (index mod numDistinctAnswers) + EOS, answer j being a fixed random
// sequence drawn from seed + 7919·j. mm_token_type_ids are all zero (no images).
TokenizedRow mockRow(const MockDatasetOptions& options, int64_t index);

}  // namespace dgemma
