#include "compiler/Driver/CompileOptions.h"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "models/builtin/RmsNormMatmulSoftmax.h"
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

std::vector<int64_t> parsePromptLengths(const std::string& text) {
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
      throw InputError("--prompt-len: expected integers in [1, " + std::to_string(kMaxLength) +
                       "] separated by commas, got " + quoteForMessage(text, 40));
    }
  }
  if (lengths.empty()) throw InputError("--prompt-len: expected at least one length");
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

bool isMultiRank(const CompileOptions& options) {
  return options.tp != 1 || options.ep != 1 || options.dp != 1 || options.sequenceParallel;
}

mlir::dg::ShardingOptions shardingOptions(const CompileOptions& options) {
  mlir::dg::ShardingOptions sharding{options.tp, options.dp, options.ep, options.sequenceParallel,
                                     options.distributedOptimizer};
  sharding.expertAllToAll = options.expertExchange == "all-to-all";
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
    throw InputError("--model: " + configPath.string() + " does not exist (expected an HF checkpoint directory, a config.json or " +
                     mlir::dg::kRmsNormMatmulSoftmaxName + ")");
  return configPath;
}

}  // namespace dgemma
