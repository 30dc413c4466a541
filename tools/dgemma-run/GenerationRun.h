// What `dgemma-run generate` and `eval` share: their common flags, and the session, tokenizer and
// Generator they open from them.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/text/Tokenizer.h"
#include "runtime/exec/TimingBackend.h"
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
  bool profile = false;     // --profile: time every kernel and host phase, print where the time went
};

struct GenerationRun {
  std::unique_ptr<Session> session;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<Generator> generator;
  PromptLimits limits;
  TimingBackend* timing = nullptr;  // the session's backend with --profile (disabled until startProfile)
};

// Opens the session and the tokenizer and checks the flags against the plan: InputError naming
// the flag (--max-new-tokens above the plan's, --tokenizer missing, ...).
GenerationRun openGenerationRun(const GenerationFlags& flags);

// With --profile: counts from now on (not the loading); without, does nothing.
void startProfile(GenerationRun& run);
// With --profile: the generation's host phases and its kernel time by op and by (op, input
// shapes), per denoising pass, on `out` (docs/generation.md, "Performance"); without, nothing.
void printProfile(const GenerationRun& run, double generationSeconds, std::FILE* out);

// The requests of prompt rows (their ids are their row indices).
std::vector<GenerationRequest> requestsOf(const std::vector<PromptRow>& rows);

// "generated R requests: N new tokens in S s, X tokens/s, Y denoising steps per canvas, Z tokens
// per step".
std::string summaryLine(const GenerationStats& stats);

}  // namespace dgemma::tool
