// What `dgemma-run generate` and `eval` share: their common flags, and the session, tokenizer and
// Generator they open from them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/generate/GenerationStats.h"
#include "runtime/generate/Generator.h"
#include "runtime/session/Session.h"
#include "tools/dgemma-run/PromptRows.h"

namespace dgemma::tool {

struct GenerationFlags {
  SessionOptions session;   // --plan, --weights, --backend, --threads
  std::string tokenizer;    // --tokenizer (default: --weights)
  int64_t maxNewTokens = 0; // --max-new-tokens (0: the plan's)
  int64_t steps = 0;        // --steps: max_denoising_steps (0: the plan's)
  uint64_t seed = 0;        // --seed
  bool skipBadRows = false; // --skip-bad-rows
};

struct GenerationRun {
  std::unique_ptr<Session> session;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Generator> generator;
  PromptLimits limits;
};

// Opens the session and the tokenizer and checks the flags against the plan: InputError naming
// the flag (--max-new-tokens above the plan's, --tokenizer missing, ...).
GenerationRun openGenerationRun(const GenerationFlags& flags);

// The requests of prompt rows (their ids are their row indices).
std::vector<GenerationRequest> requestsOf(const std::vector<PromptRow>& rows);

// "generated R requests: N new tokens in S s, X tokens/s, Y denoising steps per canvas, Z tokens
// per step".
std::string summaryLine(const GenerationStats& stats);

}  // namespace dgemma::tool
