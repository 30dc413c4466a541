// `dgemma-run export` (docs/cli.md, "Commands"; docs/training.md, "Export"): a dgemma checkpoint, or
// any HF directory of the model, written as an HF directory for serving.
#pragma once

#include <string>

namespace dgemma::tool {

struct ExportFlags {
  std::string weights;    // --weights: a dgemma checkpoint directory or an HF directory / file
  std::string out;        // --out: the new HF directory
  std::string dtype = "fp32";        // --dtype fp32 | bf16
  std::string maxShardSize = "5GB";  // --max-shard-size: bytes, or with a unit (KB, MB, GB, KiB, MiB, GiB)
  std::string model;      // --model: an HF directory or config.json whose config (and generation config) to use
  std::string planDir;    // --plan: a plan directory whose recorded config to use
  std::string tokenizer;  // --tokenizer: a tokenizer directory (Tokenizer.h)
  std::string mergeAdapter;  // --merge-adapter: a LoRA adapter directory (PEFT format) merged into the weights
};

// Parses "5GB", "100MB", "64KiB", "123" into bytes. Throws InputError naming --max-shard-size.
uint64_t parseShardSize(const std::string& text);

int runExport(const ExportFlags& flags);

}  // namespace dgemma::tool
