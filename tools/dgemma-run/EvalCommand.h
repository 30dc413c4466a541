// `dgemma-run eval` (docs/generation.md, "dgemma-run eval").
#pragma once

#include <string>

#include "tools/dgemma-run/GenerationRun.h"

namespace dgemma::tool {

struct EvalFlags {
  GenerationFlags run;
  std::string test;  // --test FILE.jsonl, rows with completions
  std::string out;   // --out FILE.jsonl: one object per row (written atomically)
};

int runEval(const EvalFlags& flags);

}  // namespace dgemma::tool
