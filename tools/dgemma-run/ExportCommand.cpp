#include "tools/dgemma-run/ExportCommand.h"

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <utility>

#include "plan/Plan.h"
#include "runtime/io/TransferProgress.h"
#include "runtime/session/Session.h"
#include "runtime/model/diffusion_gemma/HfExport.h"
#include "support/AtomicFile.h"
#include "support/CheckedSize.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma::tool {

namespace fs = std::filesystem;

uint64_t parseShardSize(const std::string& text) {
  static const std::pair<const char*, uint64_t> kUnits[] = {{"KiB", 1ULL << 10}, {"MiB", 1ULL << 20}, {"GiB", 1ULL << 30},
                                                            {"KB", 1000ULL},     {"MB", 1000000ULL},  {"GB", 1000000000ULL},
                                                            {"B", 1ULL}};
  size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
  const std::string unit = text.substr(digits);
  uint64_t scale = unit.empty() ? 1 : 0;
  for (const auto& [name, bytes] : kUnits)
    if (unit == name) scale = bytes;
  if (digits == 0 || digits > 15 || scale == 0)
    throw InputError("--max-shard-size: expected a positive size such as 5GB, 500MB, 64KiB or 1000000, got " +
                     quoteForMessage(text));
  const uint64_t value = std::stoull(text.substr(0, digits));
  if (value == 0 || value > (uint64_t{1} << 50) / scale)
    throw InputError("--max-shard-size: " + quoteForMessage(text) + " is out of range (1 byte to 1 PiB)");
  return value * scale;
}

int runExport(const ExportFlags& flags) {
  HfExportOptions options;
  options.weights = flags.weights;
  options.out = flags.out;
  options.dtype = flags.dtype == "bf16" ? DType::BF16 : DType::F32;
  options.maxShardBytes = parseShardSize(flags.maxShardSize);
  options.tokenizerDir = flags.tokenizer;
  options.mergeAdapter = flags.mergeAdapter;
  options.progress = transferProgressWanted();
  if (!flags.model.empty()) {
    const fs::path model(flags.model);
    const fs::path config = fs::is_directory(model) ? model / "config.json" : model;
    if (!fs::is_regular_file(config)) throw InputError("--model: " + config.string() + ": no such file");
    options.config = parseJson(readWholeFile(config.string()), config.string());
    const fs::path generation = config.parent_path() / "generation_config.json";
    if (fs::is_regular_file(generation)) options.generationConfig = parseJson(readWholeFile(generation.string()), generation.string());
  } else if (!flags.planDir.empty()) {
    const Plan plan = readRankPlan(flags.planDir, 0);
    if (!plan.modelConfig.is_object()) throw InputError("--plan: " + flags.planDir + ": the plan carries no model config.json");
    options.config = plan.modelConfig;
    options.generationConfig = plan.modelGenerationConfig;
  }
  const HfExportResult result = exportHfDirectory(options);
  for (const std::string& note : result.notes) std::cerr << "dgemma-run: note: " << note << "\n";
  std::printf("exported %d tensors (%s) in %d shard%s to %s: %s of weights, %s in all, %.2f s\n", result.tensors,
              flags.dtype.c_str(), result.shards, result.shards == 1 ? "" : "s", flags.out.c_str(),
              formatBytes(result.weightBytes).c_str(), formatBytes(result.totalBytes).c_str(), result.seconds);
  return 0;
}

}  // namespace dgemma::tool
