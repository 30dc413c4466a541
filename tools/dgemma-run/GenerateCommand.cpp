#include "tools/dgemma-run/GenerateCommand.h"

#include <unistd.h>

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "runtime/data/rows/Utf8.h"
#include "runtime/generate/DrawSource.h"
#include "runtime/generate/Evaluation.h"
#include "support/Error.h"
#include "tools/dgemma-run/CanvasView.h"

namespace dgemma::tool {

int runGenerate(const GenerateFlags& flags) {
  if (flags.promptGiven && !flags.input.empty())
    throw InputError("--prompt / --input: give one of them, not both (a prompt text, or a JSONL file of rows)");
  if (!flags.promptGiven && flags.input.empty())
    throw InputError("--prompt / --input: give one of them (a prompt text, or a JSONL file of rows)");
  if (flags.promptGiven && flags.prompt.empty())
    throw InputError("--prompt: expected the text of a user message, got an empty string");
  // The same strict UTF-8 as a JSONL row's text (docs/data.md): a tokenizer given broken bytes
  // would encode them silently as byte pieces.
  if (const std::optional<Utf8Problem> problem = findInvalidUtf8(flags.prompt))
    throw InputError("--prompt: " + describeUtf8Problem(*problem));
  if (!flags.images.empty() && !flags.promptGiven)
    throw InputError("--image: goes with --prompt (JSONL rows name their images themselves)");
  GenerationRun run = openGenerationRun(flags.run);
  std::vector<PromptRow> rows;
  if (flags.promptGiven) {
    rows.push_back(promptFromText(flags.prompt, flags.images, *run.tokenizer, run.limits));
  } else {
    PromptRows read = readPromptRows(flags.input, *run.tokenizer, run.limits, /*requireCompletion=*/false, flags.run.skipBadRows,
                                     flags.run.skipBadRows);
    for (const std::string& reason : read.skipped) std::cerr << "skipped: " << reason << "\n";
    if (!read.skipped.empty())
      std::cerr << "skipped " << read.skipped.size() << " of " << read.total << " rows\n";
    rows = std::move(read.rows);
  }

  const GenerationSettings& settings = run.generator->settings();
  CounterDrawSource draws(flags.run.seed, run.generator->vocabSize());
  const bool visual = flags.visual && ::isatty(STDOUT_FILENO);
  CanvasView view(*run.tokenizer, std::cout, settings.maxDenoisingSteps, settings.padTokenId);
  startProfile(run);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<GenerationResult> results =
      run.generator->generate(requestsOf(rows), draws, visual ? &view : nullptr);
  GenerationStats stats;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (visual) std::cout << "\x1b[H\x1b[2J";
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& result = results[i];
    stats.add(result, settings.padTokenId);
    const std::string text = answerText(*run.tokenizer, result.newTokens, settings.eosTokenIds, settings.padTokenId);
    if (flags.json) {
      const nlohmann::json line = {{"id", result.id},
                                   {"text", text},
                                   {"tokens", result.newTokens},
                                   {"steps_per_canvas", result.stepsPerCanvas},
                                   {"tokens_per_step", result.tokensPerForward},
                                   {"finish_reason", finishReasonName(result.finishReason)}};
      // Generated text need not be valid UTF-8; JSON must be: invalid bytes become U+FFFD.
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << text << "\n";
    }
  }
  std::cout.flush();
  printProfile(run, stats.seconds, stderr);  // before the summary line, which ends stderr
  std::cerr << summaryLine(stats) << "\n";
  return 0;
}

}  // namespace dgemma::tool
