// HF model directories out of dgemma (docs/training.md, "Export"): the files beside the weights that
// make a directory something `transformers` opens with from_pretrained, and `dgemma-run export`,
// which writes a serving directory (fp32 or bf16, sharded) from a dgemma checkpoint or any HF
// directory of the same model.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/DType.h"

namespace dgemma {

// HF's default max_shard_size ("5GB", decimal).
inline constexpr uint64_t kDefaultExportShardBytes = 5'000'000'000ULL;

// The tokenizer files an HF directory may carry; those present in a tokenizer directory are copied.
const std::vector<std::string>& hfTokenizerFileNames();

// The files beside the weights, as (file name, bytes): config.json (`config`, the model's own, as
// the plan recorded it), generation_config.json (`generationConfig`; null: HF's defaults for the
// class, what save_pretrained writes for a model without one) and the tokenizer files found in
// `tokenizerDir` (none when empty). Throws InputError when `tokenizerDir` is given and holds no
// tokenizer (holdsTokenizer, runtime/data/text/Tokenizer.h).
std::vector<std::pair<std::string, std::string>> hfSideFiles(const nlohmann::json& config,
                                                             const nlohmann::json& generationConfig,
                                                             const std::string& tokenizerDir);

// The name under which HF stores a second copy of a canonical (model.decoder.*) tensor: the encoder
// text stack's layer_scalar, a buffer, which HF's tying leaves untied (docs/model.md, "Tying").
// Nothing for every other tensor.
std::optional<std::string> untiedEncoderCopyName(const std::string& canonicalName);

struct HfExportOptions {
  std::string weights;  // a dgemma checkpoint directory (manifest.json) or an HF directory / file
  std::string out;      // must not exist; created atomically
  DType dtype = DType::F32;  // F32 or BF16 (round to nearest even)
  uint64_t maxShardBytes = kDefaultExportShardBytes;
  // The model's config.json; null: `weights`/config.json.
  nlohmann::json config;
  // generation_config.json; null: `weights`/generation_config.json when present, else HF's defaults.
  nlohmann::json generationConfig;
  std::string tokenizerDir;  // empty: the tokenizer files in `weights`, if any
  // A LoRA adapter directory (PEFT format) merged in: W + (alpha/r)·B·A, summed in f64 and rounded
  // once to `dtype`, once per tied weight (docs/training.md, "LoRA adapters"); empty: none.
  std::string mergeAdapter;
  bool progress = false;     // a progress line on stderr
};

struct HfExportResult {
  int tensors = 0;
  int shards = 0;
  uint64_t weightBytes = 0;  // tensor data
  uint64_t totalBytes = 0;   // every file written
  double seconds = 0.0;
  std::vector<std::string> notes;  // e.g. "no tokenizer files"
};

// Writes `options.out`: config.json (its "dtype" set to the export's), generation_config.json, the
// tokenizer files, every text tensor of the HF model (expectedTextWeights plus the untied encoder
// copies) and the vision tensors the source holds (all of expectedVisionWeights for an image plan's
// checkpoint; a note counts the absent ones) as model.safetensors, or model-0000i-of-0000n.safetensors shards of at most
// maxShardBytes of tensor data (a larger tensor alone) with model.safetensors.index.json, as HF's
// save_pretrained names them. Everything goes to a temporary sibling directory renamed to `out` at
// the end: on any error nothing is left. A dgemma checkpoint is verified first (CheckpointReader::load:
// manifest checksum, every file's size and XXH3-64). At most one tensor (its source copy and its
// converted bytes) is in memory at a time. Throws InputError (bad input, named with its file) or
// RuntimeError (I/O).
HfExportResult exportHfDirectory(const HfExportOptions& options);

}  // namespace dgemma
