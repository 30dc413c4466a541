#include "tools/dgemma-run/PreprocessCommand.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "runtime/data/indexed/IndexedDataset.h"
#include "runtime/data/text/Tokenizer.h"
#include "support/Error.h"
#include "support/Json.h"
#include "support/PathClash.h"
#include "tools/common/FlagRanges.h"

namespace dgemma::tool {

CLI::App* addPreprocessCommand(CLI::App& app, PreprocessFlags& flags) {
  PreprocessOptions& options = flags.options;
  options.jsonKeys = {"text"};
  CLI::App* command = app.add_subcommand(
      "preprocess", "tokenize a JSONL corpus (plain or gzip) into Megatron indexed datasets (.bin + .idx)");
  command->add_option("--input", options.input, "JSONL file, or gzip'd JSONL (told by its first bytes)")->required();
  command
      ->add_option("--json-keys,--json-key", options.jsonKeys,
                   "keys whose text to tokenize, one dataset each (default: text)")
      ->expected(1, -1);
  command
      ->add_option("--tokenizer", flags.tokenizer,
                   "tokenizer directory: tokenizer.model, tokenizer.json or vocab.json + merges.txt")
      ->required();
  command
      ->add_option("--output-prefix", options.outputPrefix,
                   "PREFIX: writes PREFIX.bin + PREFIX.idx (several keys: PREFIX_KEY_document.bin + .idx)")
      ->required();
  command->add_option("--workers", options.workers, "tokenizing threads (the output does not depend on them)")
      ->check(integerIn(1, 1024));
  command->add_flag("--append-eod,!--no-append-eod", options.appendEod,
                    "end each document with the tokenizer's EOS id (the default; Megatron's flag name)");
  command->add_flag("--skip-bad-lines", options.skipBadLines, "skip, count and list bad lines instead of failing");
  return command;
}

CLI::App* addInspectDataCommand(CLI::App& app, InspectDataFlags& flags) {
  CLI::App* command = app.add_subcommand("inspect-data", "print what an indexed dataset (.bin + .idx) holds");
  command->add_option("--prefix", flags.prefix, "PREFIX of PREFIX.idx and PREFIX.bin")->required();
  command->add_flag("--json", flags.json, "one JSON object: dtype, sequence lengths, document indices");
  command->add_flag("--tokens", flags.tokens, "with --json: every sequence's tokens too");
  return command;
}

int runPreprocess(const PreprocessFlags& flags) {
  const PreprocessOptions& options = flags.options;
  for (size_t i = 0; i < options.jsonKeys.size(); ++i)
    if (std::find(options.jsonKeys.begin(), options.jsonKeys.begin() + static_cast<std::ptrdiff_t>(i),
                  options.jsonKeys[i]) != options.jsonKeys.begin() + static_cast<std::ptrdiff_t>(i))
      throw InputError("--json-keys: expected distinct keys, got " + quoteForMessage(options.jsonKeys[i]) + " twice");
  std::vector<NamedPath> outputs;
  for (const std::string& prefix : preprocessOutputPrefixes(options.outputPrefix, options.jsonKeys)) {
    outputs.push_back({"--output-prefix", dataPath(prefix)});
    outputs.push_back({"--output-prefix", indexPath(prefix)});
  }
  checkOutputsAgainstInputs(outputs, {{"--input", options.input}, {"--tokenizer", flags.tokenizer}},
                            {{"--tokenizer", flags.tokenizer}});

  const Tokenizer tokenizer(flags.tokenizer);
  const PreprocessSummary summary = preprocessCorpus(options, tokenizer, std::cerr, ::isatty(STDERR_FILENO) != 0);
  for (const RowError& error : summary.skipped) std::cerr << "skipped: " << error.text() << "\n";
  for (size_t k = 0; k < summary.prefixes.size(); ++k)
    std::cout << dataPath(summary.prefixes[k]) << ", " << indexPath(summary.prefixes[k]) << ": " << summary.documents
              << " documents of \"" << options.jsonKeys[k] << "\", " << summary.tokens[k] << " tokens ("
              << summary.dtype << ")\n";
  std::printf(
      "preprocessed %lld lines (%.2f MB of JSONL%s) in %.3f s: %.2f MB/s with %lld workers; %lld blank, %lld skipped\n",
      static_cast<long long>(summary.lines), summary.textBytes / 1e6, summary.compressed ? ", gzip" : "",
      summary.seconds, summary.seconds > 0 ? summary.textBytes / 1e6 / summary.seconds : 0.0,
      static_cast<long long>(options.workers), static_cast<long long>(summary.blankLines),
      static_cast<long long>(summary.skipped.size()));
  return 0;
}

int runInspectData(const InspectDataFlags& flags) {
  const IndexedDatasetReader dataset(flags.prefix);
  int64_t tokens = 0, longest = 0;
  for (int64_t s = 0; s < dataset.sequenceCount(); ++s) {
    tokens += dataset.sequenceLength(s);
    longest = std::max(longest, dataset.sequenceLength(s));
  }
  if (!flags.json) {
    std::cout << flags.prefix << ": " << tokenDTypeName(dataset.dtype()) << ", " << dataset.documentCount()
              << " documents, " << dataset.sequenceCount() << " sequences, " << tokens << " tokens, longest sequence "
              << longest << (dataset.hasSequenceModes() ? ", with sequence modes" : "") << "\n";
    return 0;
  }
  nlohmann::json out = {{"prefix", flags.prefix},
                        {"dtype", tokenDTypeName(dataset.dtype())},
                        {"vocabulary_limit", dataset.vocabularyLimit()},
                        {"sequence_count", dataset.sequenceCount()},
                        {"document_count", dataset.documentCount()},
                        {"token_count", tokens},
                        {"document_indices", dataset.documentIndices()}};
  nlohmann::json lengths = nlohmann::json::array(), modes = nullptr, sequences = nlohmann::json::array();
  if (dataset.hasSequenceModes()) modes = nlohmann::json::array();
  std::vector<int64_t> sequence;
  for (int64_t s = 0; s < dataset.sequenceCount(); ++s) {
    lengths.push_back(dataset.sequenceLength(s));
    if (dataset.hasSequenceModes()) modes.push_back(dataset.sequenceMode(s));
    if (flags.tokens) {
      sequence.clear();
      dataset.readTokens(s, 0, dataset.sequenceLength(s), sequence);
      sequences.push_back(sequence);
    }
  }
  out["sequence_lengths"] = std::move(lengths);
  out["sequence_modes"] = std::move(modes);
  if (flags.tokens) out["sequences"] = std::move(sequences);
  std::cout << out.dump() << "\n";
  return 0;
}

}  // namespace dgemma::tool
