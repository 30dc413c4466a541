#include "compiler/Driver/CompileOptions.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "compiler/Transforms/LoraTargets.h"
#include "models/builtin/RmsNormMatmulSoftmax.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/spec/Interface.h"
#include "models/diffusion_gemma/spec/Presets.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

std::string builtinModelName() { return mlir::dg::kRmsNormMatmulSoftmaxName; }

std::vector<std::pair<std::string, std::string>> presetCompileFlags(const std::string& name) {
  std::vector<std::pair<std::string, std::string>> flags;
  for (const auto& [flag, value] : findPreset(name).compile.items())
    flags.emplace_back(flag, value.is_string() ? value.get<std::string>() : value.dump());
  return flags;
}

namespace {

// Comma-separated lengths in [1, kMaxLength], sorted and without repeats; `flag` names the option.
std::vector<int64_t> parseLengths(const std::string& text, const std::string& flag) {
  std::vector<int64_t> lengths;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      int64_t value = std::stoll(item, &used);
      if (used != item.size() || value < 1 || value > kMaxLength) throw std::invalid_argument(item);
      lengths.push_back(value);
    } catch (const std::logic_error&) {
      throw InputError(flag + ": expected integers in [1, " + std::to_string(kMaxLength) +
                       "] separated by commas, got " + quoteForMessage(text, 40));
    }
  }
  if (lengths.empty()) throw InputError(flag + ": expected at least one length");
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

}  // namespace

std::vector<int64_t> parsePromptLengths(const std::string& text) { return parseLengths(text, "--prompt-len"); }

std::vector<int64_t> parseSequenceLengths(const std::string& text) { return parseLengths(text, "--seq-len"); }

bool isPretrainingObjective(const CompileOptions& options) {
  return mlir::dg::parsePretrainingObjective(options.objective).has_value();
}

const std::vector<std::string>& sftObjectiveFlags() {
  static const std::vector<std::string> flags = {
      "--self-cond-prob",     "--encoder-loss-weight", "--weight-clip", "--decoder-loss-weight", "--policy-loss",
      "--clip-epsilon",       "--clip-delta",          "--kl-coeff",    "--noise-min",           "--noise-max",
      "--images-per-example", "--prompt-len",          "--canvas-len",  "--max-new-tokens",      "--lora",
      "--lora-targets",       "--lora-dropout"};
  return flags;
}

const std::vector<std::string>& pretrainingObjectiveFlags() {
  static const std::vector<std::string> flags = {"--seq-len", "--mask-token-id", "--mask-epsilon"};
  return flags;
}

void checkObjectiveFlags(const CompileOptions& options) {
  const bool pretraining = isPretrainingObjective(options);
  const bool maskedDiffusion = options.objective == "masked-diffusion";
  const bool blockDiffusion = options.objective == "block-diffusion";
  // The SFT flags that block diffusion reads: its blocks are canvases of the SFT corruption.
  static const std::vector<std::string> blockDiffusionFlags = {"--canvas-len", "--noise-min", "--noise-max"};
  for (const std::string& flag : options.explicitObjectiveFlags) {
    const bool sftFlag =
        std::find(sftObjectiveFlags().begin(), sftObjectiveFlags().end(), flag) != sftObjectiveFlags().end();
    const bool blockDiffusionFlag =
        std::find(blockDiffusionFlags.begin(), blockDiffusionFlags.end(), flag) != blockDiffusionFlags.end();
    if (blockDiffusion && blockDiffusionFlag) continue;
    if (pretraining && sftFlag)
      throw InputError(flag + ": does not apply to --objective " + options.objective +
                       (blockDiffusion
                            ? " (uniform-state block diffusion on packed text: no prompt, "
                              "self-conditioning, encoder loss, images, GRPO or LoRA; "
                              "docs/pretraining.md, \"Block diffusion on packed text\")"
                            : " (a pre-training objective on packed text: no prompt, canvas, "
                              "self-conditioning, images, GRPO or LoRA; docs/pretraining.md, \"Objectives\")"));
    if (!pretraining && !sftFlag)
      throw InputError(flag +
                       ": only with a pre-training --objective (autoregressive, masked-diffusion or block-diffusion; "
                       "docs/pretraining.md, \"Objectives\")");
    if (pretraining && !maskedDiffusion && flag != "--seq-len")
      throw InputError(flag + ": only with --objective masked-diffusion");
  }
  // --mode infer builds the objective's logits entry (docs/pretraining.md, "Sampling"): nothing is drawn.
  if (pretraining && options.mode != "train" &&
      std::find(options.explicitObjectiveFlags.begin(), options.explicitObjectiveFlags.end(), "--mask-epsilon") !=
          options.explicitObjectiveFlags.end())
    throw InputError("--mask-epsilon: only with --mode train (the logits entry of --mode infer draws no mask)");
  if (options.mode != "train" && options.optimizerOffload != "none")
    throw InputError("--optimizer-offload " + options.optimizerOffload +
                     ": only with --mode train (an inference plan has no optimizer)");
  if (options.mode != "train" && options.objective == "block-diffusion")
    throw InputError(
        "--objective block-diffusion: only with --mode train (its sampler is not built: "
        "docs/pretraining.md, \"Sampling\")");
  if (pretraining && options.sequenceLengths.empty())
    throw InputError("--objective " + options.objective + ": needs --seq-len (the packed sequence length buckets)");
}

namespace {

// A number from flag text: the whole text, finite.
std::optional<double> parseNumber(const std::string& text) {
  try {
    size_t used = 0;
    const double value = std::stod(text, &used);
    if (used == text.size() && std::isfinite(value)) return value;
  } catch (const std::logic_error&) {
  }
  return std::nullopt;
}

}  // namespace

std::optional<mlir::dg::LoraOptions> loraOptions(const CompileOptions& options) {
  if (options.lora.empty()) {
    if (options.loraTargets != CompileOptions{}.loraTargets) throw InputError("--lora-targets: only with --lora RANK");
    if (options.loraDropout != 0) throw InputError("--lora-dropout: only with --lora RANK");
    return std::nullopt;
  }
  const std::string expected = "--lora: expected RANK or RANK:ALPHA (RANK an integer in [1, " +
                               std::to_string(kMaxLoraRank) + "], ALPHA a number in (0, " +
                               std::to_string(static_cast<int64_t>(kMaxWeight)) + "]), got " +
                               quoteForMessage(options.lora, 40);
  const size_t colon = options.lora.find(':');
  const std::optional<double> rank = parseNumber(options.lora.substr(0, colon));
  if (!rank || *rank != std::floor(*rank) || *rank < 1 || *rank > kMaxLoraRank) throw InputError(expected);
  mlir::dg::LoraOptions lora;
  lora.rank = static_cast<int64_t>(*rank);
  lora.alpha = *rank;
  if (colon != std::string::npos) {
    const std::optional<double> alpha = parseNumber(options.lora.substr(colon + 1));
    if (!alpha || !(*alpha > 0) || *alpha > kMaxWeight) throw InputError(expected);
    lora.alpha = *alpha;
  }
  std::vector<std::string> listed;
  std::stringstream stream(options.loraTargets);
  for (std::string item; std::getline(stream, item, ',');) listed.push_back(item);
  std::string error;
  lora.targets = mlir::dg::expandLoraTargets(listed, error);
  if (!error.empty()) throw InputError("--lora-targets: " + error);
  if (lora.targets.empty()) throw InputError("--lora-targets: expected at least one target");
  lora.dropout = options.loraDropout;
  // Dropout is a training regulariser: the train steps draw its masks from their noise keys; the
  // inference entries and a plan without a backward run the adapters whole.
  if (options.mode == "train") {
    namespace names = ::dgemma::diffusion_gemma;
    lora.dropoutKeys = names::kNoiseKeys;
    lora.dropoutEntries = {names::kTrainStepEntry, names::kTrainStepImagesEntry};
  }
  return lora;
}

double encoderLossWeight(const CompileOptions& options) {
  if (options.policyLoss != "grpo") return options.encoderLossWeight.value_or(1.0);
  if (options.encoderLossWeight.value_or(0.0) != 0) {
    std::ostringstream weight;
    weight << *options.encoderLossWeight;
    throw InputError("--encoder-loss-weight " + weight.str() +
                     ": --policy-loss grpo takes no encoder loss (it trains on the completions as targets, which is "
                     "SFT, not RL; docs/rl.md); drop the flag or give 0");
  }
  return 0.0;
}

PolicyLossSettings policyLossSettings(const CompileOptions& options) {
  if (options.policyLoss != "grpo")
    for (const auto& [flag, value] :
         {std::pair{"--clip-epsilon", options.clipEpsilon}, std::pair{"--clip-delta", options.clipDelta},
          std::pair{"--kl-coeff", options.klCoeff}})
      if (value) throw InputError(std::string(flag) + ": only with --policy-loss grpo (docs/rl.md)");
  PolicyLossSettings settings;
  settings.clipEpsilon = options.clipEpsilon.value_or(settings.clipEpsilon);
  settings.clipDelta = options.clipDelta;
  settings.klCoeff = options.klCoeff.value_or(settings.klCoeff);
  // At or below 1 + ε the bound would cut ratios that the clip range lets through (docs/rl.md).
  if (settings.clipDelta && *settings.clipDelta <= 1.0 + settings.clipEpsilon) {
    std::ostringstream message;
    message << "--clip-delta " << *settings.clipDelta
            << ": expected a bound above 1 + --clip-epsilon = " << 1.0 + settings.clipEpsilon;
    throw InputError(message.str());
  }
  return settings;
}

bool isMultiRank(const CompileOptions& options) {
  return options.tp != 1 || options.ep != 1 || options.dp != 1 || options.cp != 1 || options.sequenceParallel;
}

mlir::dg::ShardingOptions shardingOptions(const CompileOptions& options) {
  mlir::dg::ShardingOptions sharding{options.tp, options.dp, options.ep, options.sequenceParallel,
                                     options.distributedOptimizer};
  sharding.expertAllToAll = options.expertExchange == "all-to-all";
  sharding.contextParallel = options.cp;
  return sharding;
}

void rejectUnbuiltFeatures(const CompileOptions& options) {
  if (options.precision != "fp32" && options.model == mlir::dg::kRmsNormMatmulSoftmaxName)
    throw InputError("--precision " + options.precision + ": only DiffusionGemma configs build mixed precision; " +
                     mlir::dg::kRmsNormMatmulSoftmaxName + " is fp32 only");
}

std::filesystem::path diffusionGemmaConfigPath(const CompileOptions& options) {
  std::filesystem::path path(options.model);
  std::filesystem::path configPath = std::filesystem::is_directory(path) ? path / "config.json" : path;
  if (!std::filesystem::exists(configPath))
    throw InputError("--model: " + configPath.string() +
                     " does not exist (expected an HF checkpoint directory, a config.json or " +
                     mlir::dg::kRmsNormMatmulSoftmaxName + ")");
  return configPath;
}

}  // namespace dgemma
