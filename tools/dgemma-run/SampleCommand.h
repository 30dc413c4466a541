// `dgemma-run sample` (docs/pretraining.md, "Sampling"): completions of text prompts from a
// pre-trained checkpoint through a pre-training inference plan's logits entry.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "runtime/generate/PretrainedSampler.h"
#include "runtime/session/Session.h"

namespace dgemma::tool {

struct SampleFlags {
  SessionOptions session;            // --plan, --weights or --init random (--init-seed), --backend, --threads
  std::string tokenizer;             // --tokenizer (default: --weights)
  std::vector<std::string> prompts;  // --prompt TEXT, repeatable: one completion each, in order
  PretrainedSamplingOptions sampling;  // --max-new-tokens, --temperature, --seed, --steps
  bool stepsGiven = false;           // --steps was on the command line
  bool json = false;                 // --json: one JSON object per prompt
};

// Registers the subcommand and its flags on `app`.
CLI::App* addSampleCommand(CLI::App& app, SampleFlags& flags);

int runSample(SampleFlags flags);

}  // namespace dgemma::tool
