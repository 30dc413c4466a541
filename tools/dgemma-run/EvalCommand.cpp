#include "tools/dgemma-run/EvalCommand.h"

#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>

#include "runtime/generate/DrawSource.h"
#include "runtime/generate/Evaluation.h"
#include "support/AtomicFile.h"
#include "support/Error.h"

namespace dgemma::tool {

int runEval(const EvalFlags& flags) {
  GenerationRun run = openGenerationRun(flags.run);
  // Rows the plan cannot run are always skipped and counted; malformed ones only with --skip-bad-rows.
  PromptRows read = readPromptRows(flags.test, *run.tokenizer, run.limits, /*requireCompletion=*/true, flags.run.skipBadRows,
                                   /*skipUnrunnable=*/true);
  for (const std::string& reason : read.skipped) std::cerr << "skipped: " << reason << "\n";
  if (read.rows.empty()) throw InputError("--test: " + flags.test + ": no row to evaluate (the file is empty or every row was skipped)");

  const GenerationSettings& settings = run.generator->settings();
  CounterDrawSource draws(flags.run.seed, run.generator->vocabSize());
  startProfile(run);
  const auto start = std::chrono::steady_clock::now();
  const std::vector<GenerationResult> results = run.generator->generate(requestsOf(read.rows), draws);
  GenerationStats stats;
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  int64_t exactMatches = 0, matchingTokens = 0, referenceTokens = 0;
  // Per modality (text rows, image rows): rows and exact matches.
  int64_t modalityRows[2] = {0, 0}, modalityMatches[2] = {0, 0};
  std::string perRow;
  for (size_t i = 0; i < results.size(); ++i) {
    const GenerationResult& result = results[i];
    const PromptRow& row = read.rows[i];
    stats.add(result, settings.padTokenId);
    const std::string text = answerText(*run.tokenizer, result.newTokens, settings.eosTokenIds, settings.padTokenId);
    const CompletionScore score = scoreCompletion(*run.tokenizer, text, result.newTokens, row.completion);
    exactMatches += score.exactMatch ? 1 : 0;
    const int modality = row.images.empty() ? 0 : 1;
    ++modalityRows[modality];
    modalityMatches[modality] += score.exactMatch ? 1 : 0;
    matchingTokens += score.matchingTokens;
    referenceTokens += score.referenceTokens;
    const nlohmann::json line = {{"id", row.id},
                                 {"where", row.where},
                                 {"text", text},
                                 {"completion", row.completion},
                                 {"exact_match", score.exactMatch},
                                 {"token_accuracy", score.tokenAccuracy()},
                                 {"tokens", result.newTokens},
                                 {"steps_per_canvas", result.stepsPerCanvas},
                                 {"tokens_per_step", result.tokensPerForward},
                                 {"finish_reason", finishReasonName(result.finishReason)}};
    // Generated text can end inside a multi-byte character (or hold bytes a byte-fallback piece
    // made): JSON needs UTF-8, so invalid bytes become U+FFFD rather than an exception.
    perRow += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  if (!flags.out.empty()) writeFileAtomically(flags.out, perRow);
  printProfile(run, stats.seconds, stderr);  // before the summary line, which ends stderr
  std::cerr << summaryLine(stats) << "\n";
  const int64_t rows = static_cast<int64_t>(results.size());
  auto share = [](int64_t part, int64_t whole) { return whole > 0 ? nlohmann::json(static_cast<double>(part) / whole) : nlohmann::json(); };
  const nlohmann::json summary = {
      {"exact_match", static_cast<double>(exactMatches) / rows},
      {"text_rows", modalityRows[0]},
      {"text_exact_match", share(modalityMatches[0], modalityRows[0])},
      {"image_rows", modalityRows[1]},
      {"image_exact_match", share(modalityMatches[1], modalityRows[1])},
      {"token_accuracy", referenceTokens > 0 ? static_cast<double>(matchingTokens) / referenceTokens : 0.0},
      {"rows", rows},
      {"skipped", static_cast<int64_t>(read.skipped.size())},
      {"tokens_per_second", stats.tokensPerSecond()},
      {"steps_per_canvas", stats.stepsPerCanvas()},
      {"tokens_per_step", stats.tokensPerStep()}};
  std::cout << summary.dump() << std::endl;
  return 0;
}

}  // namespace dgemma::tool
