#include "tools/dgemma-run/SampleCommand.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <nlohmann/json.hpp>

#include "runtime/data/rows/Utf8.h"
#include "runtime/data/text/Tokenizer.h"
#include "support/Error.h"
#include "tools/common/FlagRanges.h"

namespace dgemma::tool {

CLI::App* addSampleCommand(CLI::App& app, SampleFlags& flags) {
  CLI::App* command = app.add_subcommand(
      "sample", "complete text prompts from a pre-trained (autoregressive or masked-diffusion) checkpoint");
  command->add_option("--plan", flags.session.planDir, "plan directory of dgemma-compile --mode infer --objective ...")
      ->required();
  command->add_option("--backend", flags.session.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  command->add_option("--threads", flags.session.threads, "CPU worker threads (0: one per core)")
      ->check(integerIn(0, 1024));
  CLI::Option* weights = command->add_option("--weights", flags.session.weights, "HF or dgemma checkpoint directory");
  command->add_option("--init", flags.session.init, "random: the parameters' init distributions instead of --weights")
      ->check(CLI::IsMember({"random"}))
      ->excludes(weights);
  command->add_option("--init-seed", flags.session.seed, "seed of --init random")->check(anyUnsigned64());
  command->add_option(
      "--tokenizer", flags.tokenizer,
      "tokenizer directory: tokenizer.model, tokenizer.json or vocab.json + merges.txt (default: --weights)");
  command->add_option("--prompt", flags.prompts, "a text to complete (repeatable: one completion each)")->required();
  command->add_option("--max-new-tokens", flags.sampling.maxNewTokens, "new tokens per prompt (default 32)")
      ->check(integerIn(1, int64_t{1} << 20));
  command->add_option("--temperature", flags.sampling.temperature, "0: the argmax (default); above 0: sample")
      ->check(numberIn(0, 1e6));
  command->add_option("--seed", flags.sampling.seed, "seed of the draws at a temperature above 0")
      ->check(anyUnsigned64());
  command->add_option("--steps", flags.sampling.steps, "masked diffusion: unmasking passes (default: --max-new-tokens)")
      ->check(integerIn(1, int64_t{1} << 20));
  command->add_flag("--json", flags.json, "one JSON object per prompt on stdout");
  return command;
}

int runSample(SampleFlags flags) {
  if (flags.session.weights.empty() && flags.session.init.empty())
    throw InputError("--weights / --init: give the checkpoint directory (or --init random)");
  std::string tokenizerDir = flags.tokenizer;
  if (tokenizerDir.empty()) {
    if (flags.session.weights.empty() || !holdsTokenizer(flags.session.weights))
      throw InputError(
          "--tokenizer: required, as --weights holds no tokenizer.model, tokenizer.json or vocab.json + "
          "merges.txt");
    tokenizerDir = flags.session.weights;
  }
  for (size_t i = 0; i < flags.prompts.size(); ++i)
    if (const std::optional<Utf8Problem> problem = findInvalidUtf8(flags.prompts[i]))
      throw InputError("--prompt " + std::to_string(i + 1) + ": " + describeUtf8Problem(*problem));
  const Tokenizer tokenizer(tokenizerDir);
  std::unique_ptr<Session> session = openSession(flags.session);
  PretrainedSampler sampler(*session);
  tokenizer.checkVocabSize(sampler.vocabSize());
  if (flags.stepsGiven && sampler.objective() == PretrainedObjective::Autoregressive)
    throw InputError("--steps: only for a masked-diffusion plan (" + session->planPath +
                     " is autoregressive: one pass per new token)");
  // Pre-training documents end with the tokenizer's EOS (dgemma-run preprocess appends it): the end
  // of a document is what the model learned to predict there.
  flags.sampling.stopIds = {tokenizer.eosId()};

  // Every prompt is checked before any runs: a bad one is exit 2 with nothing printed.
  std::vector<std::vector<int64_t>> prompts;
  for (size_t i = 0; i < flags.prompts.size(); ++i) {
    // As preprocess encodes a document: no BOS is added (the tokenizer adds none; docs/data.md).
    const std::vector<int32_t> ids = tokenizer.encode(flags.prompts[i]);
    prompts.emplace_back(ids.begin(), ids.end());
    sampler.checkPrompt(static_cast<int64_t>(prompts.back().size()), flags.sampling,
                        "--prompt " + std::to_string(i + 1));
  }
  const auto start = std::chrono::steady_clock::now();
  int64_t newTokens = 0, passes = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::string what = "--prompt " + std::to_string(i + 1);
    const PretrainedCompletion completion = sampler.complete(i, prompts[i], flags.sampling, what);
    newTokens += static_cast<int64_t>(completion.newTokens.size());
    passes += completion.passes;
    const std::string text = tokenizer.decode(tokensBeforeStop(completion.newTokens, flags.sampling.stopIds));
    if (flags.json) {
      const nlohmann::json line = {{"prompt", flags.prompts[i]},
                                   {"text", text},
                                   {"prompt_tokens", prompts[i]},
                                   {"tokens", completion.newTokens},
                                   {"finish_reason", pretrainedFinishName(completion.finish)},
                                   {"passes", completion.passes}};
      // Decoded tokens need not be valid UTF-8; JSON must be: invalid bytes become U+FFFD.
      std::cout << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    } else {
      std::cout << flags.prompts[i] << text << "\n";
    }
  }
  std::cout.flush();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "sampled %zu prompts (%s): %lld new tokens in %lld passes, %.3f s\n", prompts.size(),
               pretrainedObjectiveName(sampler.objective()), static_cast<long long>(newTokens),
               static_cast<long long>(passes), seconds);
  return 0;
}

}  // namespace dgemma::tool
