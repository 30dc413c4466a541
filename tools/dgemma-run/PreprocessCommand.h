// `dgemma-run preprocess` and `dgemma-run inspect-data` (docs/cli.md, "Commands";
// docs/pretraining.md, "Preprocessing", "Indexed datasets"): a JSONL corpus to Megatron's indexed
// datasets, and what an indexed dataset holds.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "runtime/data/indexed/Preprocess.h"

namespace dgemma::tool {

struct PreprocessFlags {
  PreprocessOptions options;  // --input, --json-keys, --output-prefix, --workers, --append-eod, --skip-bad-lines
  std::string tokenizer;      // --tokenizer: a tokenizer directory (Tokenizer.h)
};

struct InspectDataFlags {
  std::string prefix;   // --prefix: PREFIX.idx + PREFIX.bin
  bool json = false;    // --json: one JSON object on stdout
  bool tokens = false;  // --tokens: with --json, every sequence's tokens too
};

// Register the subcommands and their flags on `app`.
CLI::App* addPreprocessCommand(CLI::App& app, PreprocessFlags& flags);
CLI::App* addInspectDataCommand(CLI::App& app, InspectDataFlags& flags);

int runPreprocess(const PreprocessFlags& flags);
int runInspectData(const InspectDataFlags& flags);

}  // namespace dgemma::tool
