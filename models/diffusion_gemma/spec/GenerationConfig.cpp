#include "models/diffusion_gemma/spec/GenerationConfig.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "support/AtomicFile.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

using json = nlohmann::json;

// HF's cache implementations (generation/configuration_utils.py, ALL_CACHE_IMPLEMENTATIONS). dgemma
// computes what the dynamic cache computes; "offloaded" only moves that cache to the host.
const std::set<std::string> kSameAsDynamic = {"dynamic", "offloaded"};
const std::set<std::string> kOtherCaches = {"static",           "offloaded_static", "quantized",
                                            "sliding_window",   "hybrid",           "hybrid_chunked",
                                            "offloaded_hybrid", "offloaded_hybrid_chunked"};

// Never walks the value (the file is untrusted).
std::string describe(const json& value) { return describeJsonValue(value); }

// The largest count a setting may give (docs/generation.md, "Defaults and settings"): far above any real
// generation, and small enough that the cache and canvas sizes built from it cannot overflow.
constexpr int64_t kMaxCount = int64_t{1} << 24;
// Token ids are checked against the vocabulary where the model is known; here only their size.
constexpr int64_t kMaxTokenId = int64_t{1} << 24;

class Reader {
 public:
  Reader(const json& object, std::string source, std::string prefix)
      : object_(object), source_(std::move(source)), prefix_(std::move(prefix)) {}

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    throw InputError(source_ + ": " + prefix_ + key + ": " + what);
  }

  // The value of `key`; nullptr when absent or null (both mean "default" in HF).
  const json* find(const std::string& key) const {
    auto found = object_.find(key);
    return found == object_.end() || found->is_null() ? nullptr : &*found;
  }

  std::optional<int64_t> integer(const std::string& key, int64_t minimum, int64_t maximum = kMaxCount) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    return requireInteger(key, *value, minimum, maximum);
  }

  int64_t requireInteger(const std::string& key, const json& value, int64_t minimum, int64_t maximum) const {
    const bool inRange = value.is_number_integer() &&
                         !(value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(maximum)) &&
                         value.get<int64_t>() >= minimum && value.get<int64_t>() <= maximum;
    if (!inRange)
      fail(key, "expected an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "], got " +
                    describe(value));
    return value.get<int64_t>();
  }

  // HF checks these with isinstance(value, float): 1 is rejected where 1.0 is taken.
  std::optional<double> decimal(const std::string& key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_number_float() || !std::isfinite(value->get<double>()))
      fail(key, "expected a finite number with a decimal point (HF requires a float), got " + describe(*value));
    return value->get<double>();
  }

  std::optional<double> number(const std::string& key) const {
    const json* value = find(key);
    if (!value) return std::nullopt;
    if (!value->is_number() || !std::isfinite(value->get<double>())) fail(key, "expected a finite number, got " + describe(*value));
    return value->get<double>();
  }

  void requireType(const std::string& key, bool (json::*isType)() const noexcept, const std::string& expected) const {
    const json* value = find(key);
    if (value && !((*value).*isType)()) fail(key, "expected " + expected + " or null, got " + describe(*value));
  }

  void rejectUnknownKeys(const std::set<std::string>& known) const {
    for (const auto& [key, value] : object_.items())
      if (!known.count(key)) fail(key, "unknown key (HF's generation config does not accept it either)");
  }

 private:
  const json& object_;
  std::string source_;
  std::string prefix_;
};

// sampler_config: EntropyBoundSamplerConfig as HF serialises it, {"entropy_bound": b, "_cls_name": ...}.
double readSamplerConfig(const Reader& file, const json& value, const std::string& source) {
  if (!value.is_object()) file.fail("sampler_config", "expected an object {\"entropy_bound\": ...} or null, got " + describe(value));
  Reader sampler(value, source, "sampler_config.");
  sampler.rejectUnknownKeys({"entropy_bound", "_cls_name"});
  if (const json* name = sampler.find("_cls_name"); name && *name != "EntropyBoundSamplerConfig")
    sampler.fail("_cls_name", "expected \"EntropyBoundSamplerConfig\" (the only sampler), got " + describe(*name));
  std::optional<double> bound = sampler.decimal("entropy_bound");
  if (!bound) sampler.fail("entropy_bound", "missing (the sampler config has no default bound)");
  if (!(*bound > 0)) sampler.fail("entropy_bound", "expected a number > 0, got " + describe(value["entropy_bound"]));
  return *bound;
}

}  // namespace

DiffusionGemmaGenerationConfig parseGenerationConfig(const json& root, const std::string& source) {
  if (!root.is_object()) throw InputError(source + ": expected a JSON object at the top level, got " + describe(root));
  Reader file(root, source, "");
  file.rejectUnknownKeys({"max_new_tokens", "max_length", "return_dict_in_generate", "max_denoising_steps", "sampler_config",
                          "t_min", "t_max", "stability_threshold", "confidence_threshold", "cache_implementation",
                          "cache_config", "disable_compile", "bos_token_id", "pad_token_id", "eos_token_id", "_commit_hash",
                          "_from_model_config", "_original_object_hash", "transformers_version"});
  DiffusionGemmaGenerationConfig config;
  config.source = source;
  if (std::optional<int64_t> tokens = file.integer("max_new_tokens", 1)) {
    config.maxNewTokens = *tokens;
    config.maxNewTokensGiven = true;
  }
  config.maxLength = file.integer("max_length", 1);
  config.maxDenoisingSteps = file.integer("max_denoising_steps", 1).value_or(config.maxDenoisingSteps);
  if (const json* sampler = file.find("sampler_config")) config.entropyBound = readSamplerConfig(file, *sampler, source);
  config.tMin = file.number("t_min").value_or(config.tMin);
  config.tMax = file.number("t_max").value_or(config.tMax);
  if (!(config.tMin >= 0)) file.fail("t_min", "expected a number >= 0, got " + describeJsonValue(json(config.tMin)));
  // Checked after the defaults fill in, as HF validates again before generating.
  if (!(config.tMax > config.tMin))
    file.fail("t_max", "expected a number above t_min (" + describeJsonValue(json(config.tMin)) + "), got " + describeJsonValue(json(config.tMax)));
  config.stabilityThreshold = file.integer("stability_threshold", 0).value_or(config.stabilityThreshold);
  if (std::optional<double> threshold = file.decimal("confidence_threshold")) {
    if (!(*threshold > 0)) file.fail("confidence_threshold", "expected a number > 0, got " + describeJsonValue(json(*threshold)));
    config.confidenceThreshold = *threshold;
  }

  if (const json* cache = file.find("cache_implementation")) {
    if (!cache->is_string()) file.fail("cache_implementation", "expected a string or null, got " + describe(*cache));
    const std::string name = cache->get<std::string>();
    if (kOtherCaches.count(name))
      file.fail("cache_implementation", "\"" + name + "\" is not supported: dgemma computes what HF's dynamic cache computes "
                                        "(null, \"dynamic\" or \"offloaded\")");
    if (!kSameAsDynamic.count(name)) file.fail("cache_implementation", "unknown cache implementation " + describe(*cache));
  }
  // Only HF's quantized and static caches read cache_config, and those are rejected above.
  file.requireType("cache_config", &json::is_object, "an object");
  file.requireType("return_dict_in_generate", &json::is_boolean, "true or false");
  file.requireType("disable_compile", &json::is_boolean, "true or false");
  file.requireType("_commit_hash", &json::is_string, "a string");
  file.requireType("_from_model_config", &json::is_boolean, "true or false");
  file.requireType("transformers_version", &json::is_string, "a string");

  config.bosTokenId = file.integer("bos_token_id", 0, kMaxTokenId);
  config.padTokenId = file.integer("pad_token_id", 0, kMaxTokenId);
  if (const json* eos = file.find("eos_token_id")) {
    if (eos->is_array()) {
      std::vector<int64_t> ids;
      for (size_t i = 0; i < eos->size(); ++i) {
        ids.push_back(file.requireInteger("eos_token_id[" + std::to_string(i) + "]", (*eos)[i], 0, kMaxTokenId));
      }
      config.eosTokenIds = ids;
    } else {
      config.eosTokenIds = std::vector<int64_t>{*file.integer("eos_token_id", 0, kMaxTokenId)};
    }
  }
  return config;
}

void checkGenerationTokenIds(const DiffusionGemmaGenerationConfig& config, int64_t vocabSize) {
  const std::string vocabulary = "the model's vocabulary [0, " + std::to_string(vocabSize) + ") (config.json vocab_size)";
  auto check = [&](const std::string& field, int64_t id) {
    if (id < 0 || id >= vocabSize)
      throw InputError(config.source + ": " + field + ": token id " + std::to_string(id) + " is outside " + vocabulary);
  };
  if (config.eosTokenIds) {
    if (config.eosTokenIds->empty())
      throw InputError(config.source + ": eos_token_id: expected a token id or a non-empty list of them, got [] "
                       "(generation would never stop at an end of sequence)");
    for (size_t i = 0; i < config.eosTokenIds->size(); ++i)
      check(config.eosTokenIds->size() == 1 ? "eos_token_id" : "eos_token_id[" + std::to_string(i) + "]", (*config.eosTokenIds)[i]);
  }
  if (config.padTokenId) check("pad_token_id", *config.padTokenId);
  if (config.bosTokenId) check("bos_token_id", *config.bosTokenId);
}

std::optional<DiffusionGemmaGenerationConfig> loadGenerationConfigBeside(const std::string& modelPath) {
  const std::filesystem::path model(modelPath);
  const std::filesystem::path directory = std::filesystem::is_directory(model) ? model : model.parent_path();
  const std::filesystem::path path = (directory.empty() ? std::filesystem::path(".") : directory) / "generation_config.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  if (!std::filesystem::is_regular_file(path))
    throw InputError(path.string() + ": cannot open the generation config: not a regular file");
  const json root = parseJson(readWholeFile(path.string()), path.string());
  return parseGenerationConfig(root, path.string());
}

}  // namespace dgemma
