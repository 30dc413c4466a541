#include "tools/dgemma-run/GenerationRun.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "plan/PlanFile.h"
#include "support/Error.h"

namespace dgemma::tool {

GenerationRun openGenerationRun(const GenerationFlags& flags) {
  std::string tokenizerDir = flags.tokenizer;
  if (tokenizerDir.empty()) {
    if (!holdsTokenizer(flags.session.weights))
      throw InputError("--tokenizer: required, as --weights " + flags.session.weights +
                       " holds no tokenizer.model, tokenizer.json or vocab.json + merges.txt (the bundled one is "
                       "data/tokenizer)");
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
  SessionOptions sessionOptions = flags.session;
  sessionOptions.timeKernels = flags.profile;
  run.session = openSession(sessionOptions, std::move(plan));
  if (flags.profile) {
    run.timing = dynamic_cast<TimingBackend*>(run.session->backend.get());
    run.timing->setEnabled(false);
  }
  GeneratorOptions options;
  options.maxNewTokens = flags.maxNewTokens;
  options.maxDenoisingSteps = flags.steps;
  run.generator = std::make_unique<Generator>(*run.session, options);
  run.limits.maxPromptLength = run.generator->maxPromptLength();
  run.limits.vocabSize = run.generator->vocabSize();
  run.limits.imagesPerExample = run.generator->imagesPerExample();
  run.limits.image = run.generator->imageOptions();
  run.tokenizer->checkVocabSize(run.limits.vocabSize);
  return run;
}

void startProfile(GenerationRun& run) {
  if (run.timing) run.timing->setEnabled(true);
}

void printProfile(const GenerationRun& run, double generationSeconds, std::FILE* out) {
  if (!run.timing) return;
  const GenerationPhaseTimes& phases = run.generator->phaseTimes();
  const double passes = static_cast<double>(std::max<int64_t>(phases.denoisePasses, 1));
  std::fprintf(out, "\nprofile: %lld denoise passes (micro-batch %lld), %lld prefills, %lld commits in %.3f s; %.2f ms per pass\n",
               static_cast<long long>(phases.denoisePasses), static_cast<long long>(run.generator->microBatch()),
               static_cast<long long>(phases.prefills), static_cast<long long>(phases.commits), generationSeconds,
               1e3 * generationSeconds / passes);
  std::fprintf(out, "%-28s %10s %10s %8s\n", "host phase", "s", "ms/pass", "share");
  const std::pair<const char*, double> rows[] = {{"prefill (entry runs)", phases.prefill},
                                                 {"denoise (entry runs)", phases.denoise},
                                                 {"sampler host work", phases.samplerHost},
                                                 {"commit (entry runs)", phases.commit}};
  double accounted = 0;
  for (const auto& [name, seconds] : rows) {
    accounted += seconds;
    std::fprintf(out, "%-28s %10.3f %10.3f %7.1f%%\n", name, seconds, 1e3 * seconds / passes, 100 * seconds / generationSeconds);
  }
  const double rest = generationSeconds - accounted;
  std::fprintf(out, "%-28s %10.3f %10.3f %7.1f%%\n", "(rest)", rest, 1e3 * rest / passes, 100 * rest / generationSeconds);
  std::fprintf(out, "\nkernels of every entry (%.3f s), per denoise pass\n", run.timing->totalSeconds());
  printKernelProfile(out, *run.timing, passes, "pass", 25);
}

std::vector<GenerationRequest> requestsOf(const std::vector<PromptRow>& rows) {
  std::vector<GenerationRequest> requests;
  for (const PromptRow& row : rows) requests.push_back({row.id, row.promptIds, row.promptTokenTypes, row.images});
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
