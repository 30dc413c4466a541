// `dgemma-run generate` (docs/generation.md, "dgemma-run generate").
#pragma once

#include <string>

#include "tools/dgemma-run/GenerationRun.h"

namespace dgemma::tool {

struct GenerateFlags {
  GenerationFlags run;
  std::string prompt;  // --prompt TEXT: one user message ...
  bool promptGiven = false;  // --prompt was on the command line (an empty text included)
  std::string input;   // ... or --input FILE.jsonl
  std::vector<std::string> images;  // --image PATH, repeatable (with --prompt): the prompt's images, in order
  bool json = false;   // --json: one JSON object per request
  bool visual = false; // --visual: redraw the canvas every denoising step (on a terminal)
};

int runGenerate(const GenerateFlags& flags);

}  // namespace dgemma::tool
