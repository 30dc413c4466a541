#include "tools/dgemma-run/GenerationRun.h"

#include <cstdio>
#include <filesystem>

#include "plan/PlanFile.h"
#include "support/Error.h"

namespace dgemma::tool {

GenerationRun openGenerationRun(const GenerationFlags& flags) {
  namespace fs = std::filesystem;
  std::string tokenizerDir = flags.tokenizer;
  if (tokenizerDir.empty()) {
    if (!fs::exists(fs::path(flags.session.weights) / "tokenizer.model") && !fs::exists(fs::path(flags.session.weights) / "tokenizer.json"))
      throw InputError("--tokenizer: required, as --weights " + flags.session.weights +
                       " holds no tokenizer.model or tokenizer.json (the bundled one is data/tokenizer)");
    tokenizerDir = flags.session.weights;
  }
  GenerationRun run;
  run.tokenizer = std::make_unique<Tokenizer>(tokenizerDir);
  Plan plan = loadPlan(flags.session);
  const std::string planPath = planFileForRank(flags.session.planDir, flags.session.rank);
  if (!plan.generation)
    throw InputError("--plan: " + planPath + " is not an inference plan (compile it with dgemma-compile --mode infer)");
  if (flags.maxNewTokens > plan.generation->maxNewTokens)
    throw InputError("--max-new-tokens: " + std::to_string(flags.maxNewTokens) + " is above the plan's max_new_tokens " +
                     std::to_string(plan.generation->maxNewTokens) + " (its cache is sized for that; recompile for more)");
  run.session = openSession(flags.session, std::move(plan));
  GeneratorOptions options;
  options.maxNewTokens = flags.maxNewTokens;
  options.maxDenoisingSteps = flags.steps;
  run.generator = std::make_unique<Generator>(*run.session, options);
  run.limits.maxPromptLength = run.generator->maxPromptLength();
  run.limits.vocabSize = run.generator->vocabSize();
  run.tokenizer->checkVocabSize(run.limits.vocabSize);
  return run;
}

std::vector<GenerationRequest> requestsOf(const std::vector<PromptRow>& rows) {
  std::vector<GenerationRequest> requests;
  for (const PromptRow& row : rows) requests.push_back({row.id, row.promptIds});
  return requests;
}

std::string summaryLine(const GenerationStats& stats) {
  char line[256];
  std::snprintf(line, sizeof line,
                "generated %lld requests: %lld new tokens in %.3f s, %.1f tokens/s, %.2f denoising steps per canvas, %.2f "
                "tokens per step",
                static_cast<long long>(stats.requests), static_cast<long long>(stats.newTokens), stats.seconds,
                stats.tokensPerSecond(), stats.stepsPerCanvas(), stats.tokensPerStep());
  return line;
}

}  // namespace dgemma::tool
