// The HF generation_config.json of a DiffusionGemma checkpoint (docs/generation.md, "Defaults and settings"):
// the keys HF's DiffusionGemmaGenerationConfig accepts, with its checks, and the defaults it
// applies to what the file leaves unset or null. Like HF, an unknown key is an error.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dgemma {

struct DiffusionGemmaGenerationConfig {
  // The defaults HF applies to unset parameters (DiffusionGemmaGenerationConfig's
  // _get_default_generation_params), as docs/generation.md lists them.
  int64_t maxNewTokens = 256;
  bool maxNewTokensGiven = false;    // the file set it (HF lets max_length win only when it did not)
  std::optional<int64_t> maxLength;  // prompt + generated tokens
  int64_t maxDenoisingSteps = 48;
  double entropyBound = 0.1;
  double tMin = 0.4;
  double tMax = 0.8;
  int64_t stabilityThreshold = 1;
  double confidenceThreshold = 0.005;
  // Unset here: the model config's ids apply.
  std::optional<std::vector<int64_t>> eosTokenIds;  // a single id becomes a list of one
  std::optional<int64_t> padTokenId;
  std::optional<int64_t> bosTokenId;
  std::string source;  // the file, for messages ("" for HF's defaults)
};

// The settings of `root`, the parsed file; `source` names it in messages ("PATH: FIELD: ...").
DiffusionGemmaGenerationConfig parseGenerationConfig(const nlohmann::json& root, const std::string& source);

// InputError "SOURCE: FIELD: ..." when an id the file sets (eos_token_id, each of a list, which must
// not be empty; pad_token_id; bos_token_id) is outside the model's vocabulary [0, vocabSize): the
// sampler would emit or wait for a token the model cannot produce.
void checkGenerationTokenIds(const DiffusionGemmaGenerationConfig& config, int64_t vocabSize);

// The generation_config.json beside a model: in `modelPath` when it is a directory, else in the
// directory of the config.json it names. nullopt when there is none (HF's defaults apply).
std::optional<DiffusionGemmaGenerationConfig> loadGenerationConfigBeside(const std::string& modelPath);

}  // namespace dgemma
