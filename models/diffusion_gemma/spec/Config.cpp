#include "models/diffusion_gemma/spec/Config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <stdexcept>

#include "support/AtomicFile.h"
#include "support/CheckedSize.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

using json = nlohmann::json;

constexpr std::string_view kSlidingName = "sliding_attention";
constexpr std::string_view kFullName = "full_attention";

// HF's DiffusionGemmaTextConfig class defaults (docs/model.md, "Text config"), used for absent fields exactly as HF
// uses them. The MoE sizes have no usable default (None), so they are required.
constexpr int64_t kDefaultVocabSize = 262144;
constexpr int64_t kDefaultHiddenSize = 2304;
constexpr int64_t kDefaultIntermediateSize = 9216;
constexpr int64_t kDefaultNumHiddenLayers = 30;
constexpr int64_t kDefaultNumAttentionHeads = 8;
constexpr int64_t kDefaultNumKeyValueHeads = 4;
constexpr int64_t kDefaultHeadDim = 256;
constexpr int64_t kDefaultGlobalHeadDim = 512;
constexpr int64_t kDefaultMaxPositionEmbeddings = 131072;
constexpr int64_t kDefaultSlidingWindow = 512;
constexpr double kDefaultRmsNormEps = 1e-6;
constexpr double kDefaultFinalLogitSoftcapping = 30.0;
constexpr double kDefaultInitializerRange = 0.02;  // HF Gemma 4's
constexpr int64_t kDefaultPadTokenId = 0;
constexpr int64_t kDefaultEosTokenId = 1;
constexpr int64_t kDefaultBosTokenId = 2;
// docs/model.md, "Config loading rules": without layer_types, every sixth layer is full attention.
constexpr int64_t kDefaultFullAttentionPeriod = 6;

// HF's DiffusionGemmaConfig (top-level) class defaults (docs/model.md, "Top-level config").
constexpr int64_t kDefaultCanvasLength = 256;
constexpr int64_t kDefaultBoiTokenId = 255999;
constexpr int64_t kDefaultEoiTokenId = 258882;
constexpr int64_t kDefaultImageTokenId = 258880;
constexpr int64_t kDefaultSoftTokensPerImage = 280;  // vision_soft_tokens_per_image

// The largest value each size field may take (docs/model.md, "Field ranges"): far above any real
// Gemma 4 geometry (the 26B-A4B values are 262144, 2816, 2112, 30, 16, 8, 512, 128, 704, 262144,
// 1024, 256), and small enough that every weight shape and every product the builder forms stays
// far from int64 overflow. What is still too large to hold is refused when the model is built
// (kMaxTensorBytes).
constexpr int64_t kMaxVocabSize = int64_t{1} << 24;
constexpr int64_t kMaxHiddenSize = int64_t{1} << 16;
constexpr int64_t kMaxMlpWidth = int64_t{1} << 20;  // intermediate_size, moe_intermediate_size
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 1024;  // query and KV heads
constexpr int64_t kMaxHeadDim = 8192;
constexpr int64_t kMaxExperts = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 24;  // max_position_embeddings, sliding_window
constexpr int64_t kMaxCanvasLength = int64_t{1} << 16;
constexpr double kMaxRmsNormEps = 1.0;
constexpr double kMaxLogitSoftcapping = 1e6;
constexpr double kMaxRopeTheta = 1e12;
constexpr double kMaxInitializerRange = 1.0;
// Vision sizes (docs/model.md, "Field ranges"): the 26B values are 16 (patch), 3 (pooling kernel),
// 10240 (position table) and 280 (soft tokens per image).
constexpr int64_t kMaxPatchSize = 256;
constexpr int64_t kMaxPoolingKernel = 64;
constexpr int64_t kMaxSoftTokensPerImage = int64_t{1} << 16;

// Fields every HF config.json may carry that say nothing about the network.
const std::set<std::string> kBookkeepingFields = {
    "model_type", "architectures", "transformers_version", "dtype", "torch_dtype", "_name_or_path", "initializer_range",
    "use_cache"};

// Gemma 4 top-level fields for audio and video, which DiffusionGemma removed (docs/model.md, "Top-level config").
const std::vector<std::string> kAudioVideoFields = {"audio_config",    "audio_token_id", "boa_token_id",
                                                    "eoa_token_index", "eoa_token_id",   "video_token_id"};

// Never walks the value: a config is untrusted, and a deep one would overflow the stack.
std::string describe(const json& value) { return describeJsonValue(value); }

std::optional<int64_t> asInteger(const json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t unsignedValue = value.get<uint64_t>();
    if (unsignedValue > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(unsignedValue);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// Reads the fields of one JSON object. Each field is named by its path in the file
// ("text_config.num_experts"), and every key read is remembered, so that the others can be
// reported as ignored.
class FieldReader {
 public:
  FieldReader(const json& object, std::string filePath, std::string fieldPrefix)
      : object_(object), filePath_(std::move(filePath)), fieldPrefix_(std::move(fieldPrefix)) {}

  const std::string& filePath() const { return filePath_; }
  std::string fieldName(std::string_view key) const { return fieldPrefix_ + std::string(key); }

  [[noreturn]] void fail(std::string_view key, const std::string& what) const {
    throw InputError(filePath_ + ": " + fieldName(key) + ": " + what);
  }

  // The value under `key`, or nullptr when absent; either way the key counts as read.
  const json* find(std::string_view key) {
    readKeys_.insert(std::string(key));
    auto found = object_.find(std::string(key));
    return found == object_.end() ? nullptr : &*found;
  }

  // An absent key takes `defaultValue`; without a default it is an error whose text is `whyRequired`.
  int64_t integer(std::string_view key, std::optional<int64_t> defaultValue, int64_t minimum, int64_t maximum,
                  const std::string& whyRequired = "") {
    const json* value = find(key);
    if (!value) {
      if (!defaultValue) fail(key, "missing; " + whyRequired);
      return *defaultValue;
    }
    return requireInteger(key, *value, minimum, maximum);
  }

  int64_t requireInteger(std::string_view key, const json& value, int64_t minimum, int64_t maximum) const {
    const std::optional<int64_t> parsed = asInteger(value);
    if (!parsed || *parsed < minimum || *parsed > maximum)
      fail(key, "expected an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "], got " +
                    describe(value));
    return *parsed;
  }

  // Head dims must be even: RoPE pairs dim i with dim i + head_dim/2.
  int64_t evenInteger(std::string_view key, int64_t defaultValue) {
    const json* value = find(key);
    if (!value) return defaultValue;
    return requireEven(key, *value);
  }

  int64_t requireEven(std::string_view key, const json& value) const {
    const std::optional<int64_t> parsed = asInteger(value);
    if (!parsed || *parsed < 2 || *parsed > kMaxHeadDim || *parsed % 2 != 0)
      fail(key, "expected an even integer in [2, " + std::to_string(kMaxHeadDim) + "], got " + describe(value));
    return *parsed;
  }

  double positiveNumber(std::string_view key, double defaultValue, double maximum) {
    const json* value = find(key);
    if (!value) return defaultValue;
    if (!value->is_number() || !(value->get<double>() > 0.0) || !(value->get<double>() <= maximum))
      fail(key, "expected a number in (0, " + describeJsonValue(json(maximum)) + "], got " + describe(*value));
    return value->get<double>();
  }

  bool boolean(std::string_view key, bool defaultValue) {
    const json* value = find(key);
    if (!value) return defaultValue;
    if (!value->is_boolean()) fail(key, "expected true or false, got " + describe(*value));
    return value->get<bool>();
  }

  // Keys never read: neither handled nor bookkeeping. HF keeps them as plain attributes and does
  // nothing with them (docs/model.md, "Config loading rules"), so they only earn a warning.
  void warnAboutUnreadKeys(std::vector<std::string>& warnings) const {
    for (const auto& [key, value] : object_.items()) {
      if (readKeys_.count(key) || kBookkeepingFields.count(key)) continue;
      warnings.push_back(filePath_ + ": " + fieldName(key) + ": unknown field, ignored");
    }
  }

 private:
  const json& object_;
  std::string filePath_;
  std::string fieldPrefix_;
  std::set<std::string> readKeys_;
};

std::optional<AttentionLayerType> parseLayerType(const json& value) {
  if (!value.is_string()) return std::nullopt;
  const std::string name = value.get<std::string>();
  if (name == kSlidingName) return AttentionLayerType::Sliding;
  if (name == kFullName) return AttentionLayerType::Full;
  return std::nullopt;
}

std::string_view layerTypeName(AttentionLayerType type) {
  return type == AttentionLayerType::Full ? kFullName : kSlidingName;
}

std::string layerTypeExpectation() {
  return "expected \"" + std::string(kSlidingName) + "\" or \"" + std::string(kFullName) + "\"";
}

// docs/model.md, "Config loading rules".
std::vector<AttentionLayerType> readLayerTypes(FieldReader& text, int64_t numHiddenLayers,
                                               std::vector<std::string>& warnings) {
  std::vector<AttentionLayerType> types;
  const json* value = text.find("layer_types");
  if (!value || value->is_null()) {
    for (int64_t i = 0; i < numHiddenLayers; ++i)
      types.push_back((i + 1) % kDefaultFullAttentionPeriod == 0 ? AttentionLayerType::Full
                                                                 : AttentionLayerType::Sliding);
  } else {
    if (!value->is_array()) text.fail("layer_types", "expected a list of layer types, got " + describe(*value));
    if (static_cast<int64_t>(value->size()) != numHiddenLayers)
      text.fail("layer_types", "expected " + std::to_string(numHiddenLayers) + " entries (num_hidden_layers), got " +
                                   std::to_string(value->size()));
    for (size_t i = 0; i < value->size(); ++i) {
      const std::optional<AttentionLayerType> type = parseLayerType((*value)[i]);
      if (!type)
        text.fail("layer_types[" + std::to_string(i) + "]", layerTypeExpectation() + ", got " + describe((*value)[i]));
      types.push_back(*type);
    }
  }
  if (types.back() != AttentionLayerType::Full) {
    warnings.push_back(text.filePath() + ": " +
                       text.fieldName("layer_types[" + std::to_string(numHiddenLayers - 1) + "]") +
                       ": the last layer must use full_attention, got sliding_attention; forced to full_attention");
    types.back() = AttentionLayerType::Full;
  }
  return types;
}

RopeParameters readRopeEntry(const json& entry, FieldReader& text, const std::string& key) {
  if (!entry.is_object()) text.fail(key, "expected an object with rope_type and rope_theta, got " + describe(entry));
  FieldReader rope(entry, text.filePath(), text.fieldName(key) + ".");
  RopeParameters parameters;
  const json* type = rope.find("rope_type");
  if (!type) rope.fail("rope_type", "missing");
  if (*type == "default") {
    parameters.type = RopeType::Default;
  } else if (*type == "proportional") {
    parameters.type = RopeType::Proportional;
  } else {
    rope.fail("rope_type", "expected \"default\" or \"proportional\", got " + describe(*type));
  }
  const json* theta = rope.find("rope_theta");
  if (!theta) rope.fail("rope_theta", "missing");
  parameters.theta = rope.positiveNumber("rope_theta", 0.0, kMaxRopeTheta);
  if (const json* factor = rope.find("partial_rotary_factor")) {
    const double value = factor->is_number() ? factor->get<double>() : 0.0;
    if (parameters.type == RopeType::Default && !(factor->is_number() && value == 1.0))
      rope.fail("partial_rotary_factor",
                "expected 1 with rope_type \"default\" (only proportional RoPE rotates part of the head), got " +
                    describe(*factor));
    if (!factor->is_number() || !(value > 0.0 && value <= 1.0))
      rope.fail("partial_rotary_factor", "expected a number in (0, 1], got " + describe(*factor));
    parameters.partialRotaryFactor = value;
  }
  // HF's linear position scaling; DiffusionGemma never scales RoPE (docs/model.md, "Text config").
  if (const json* factor = rope.find("factor")) {
    if (!(factor->is_number() && factor->get<double>() == 1.0))
      rope.fail("factor", "expected 1 (RoPE scaling is not supported), got " + describe(*factor));
  }
  for (const auto& [name, value] : entry.items()) {
    if (name != "rope_type" && name != "rope_theta" && name != "partial_rotary_factor" && name != "factor")
      rope.fail(name, "not supported (a RoPE entry takes rope_type, rope_theta, partial_rotary_factor and factor)");
  }
  return parameters;
}

// docs/model.md, "Config loading rules": without rope_parameters each layer type gets HF's default; with them, every layer
// type in use needs an entry.
std::map<AttentionLayerType, RopeParameters> readRopeParameters(FieldReader& text,
                                                                const std::vector<AttentionLayerType>& layerTypes) {
  std::map<AttentionLayerType, RopeParameters> ropeByType;
  const json* value = text.find("rope_parameters");
  if (!value || value->is_null()) {
    ropeByType[AttentionLayerType::Sliding] = RopeParameters{RopeType::Default, 10000.0, 1.0};
    ropeByType[AttentionLayerType::Full] = RopeParameters{RopeType::Proportional, 1e6, 0.25};
    return ropeByType;
  }
  if (!value->is_object())
    text.fail("rope_parameters", "expected an object keyed by layer type, got " + describe(*value));
  for (const auto& [key, entry] : value->items()) {
    const std::optional<AttentionLayerType> type = parseLayerType(key);
    if (!type) text.fail("rope_parameters." + key, "not a layer type: " + layerTypeExpectation());
    ropeByType[*type] = readRopeEntry(entry, text, "rope_parameters." + key);
  }
  for (size_t i = 0; i < layerTypes.size(); ++i) {
    if (!ropeByType.count(layerTypes[i]))
      text.fail("rope_parameters." + std::string(layerTypeName(layerTypes[i])),
                "missing (layer " + std::to_string(i) + " is " + std::string(layerTypeName(layerTypes[i])) + ")");
  }
  return ropeByType;
}

// A layer's attention geometry together with the fields its head counts came from, so that counts
// that do not divide can be blamed on the field that set them. (Head dims are checked as they are read.)
struct SourcedGeometry {
  LayerGeometry geometry;
  std::string numQueryHeadsField;
  std::string numKeyValueHeadsField;
};

// The full-layer geometry in either HF spelling (docs/model.md, "Text config"): per_layer_config overrides when the
// file has it (and then global_head_dim / num_global_key_value_heads are ignored, as in HF);
// otherwise every full layer takes global_head_dim (default 512) and, when set,
// num_global_key_value_heads.
void applyPerLayerGeometry(FieldReader& text, std::vector<SourcedGeometry>& layers,
                           std::vector<std::string>& warnings) {
  const json* globalHeadDimValue = text.find("global_head_dim");
  const json* globalKeyValueHeadsValue = text.find("num_global_key_value_heads");
  std::optional<int64_t> globalHeadDim;
  std::optional<int64_t> globalKeyValueHeads;
  if (globalHeadDimValue) globalHeadDim = text.requireEven("global_head_dim", *globalHeadDimValue);
  if (globalKeyValueHeadsValue && !globalKeyValueHeadsValue->is_null())
    globalKeyValueHeads = text.integer("num_global_key_value_heads", std::nullopt, 1, kMaxHeads);

  const json* perLayerConfig = text.find("per_layer_config");
  if (!perLayerConfig) {
    for (SourcedGeometry& layer : layers) {
      if (layer.geometry.type != AttentionLayerType::Full) continue;
      layer.geometry.headDim = globalHeadDim.value_or(kDefaultGlobalHeadDim);
      if (globalKeyValueHeads) {
        layer.geometry.numKeyValueHeads = *globalKeyValueHeads;
        layer.numKeyValueHeadsField = text.fieldName("num_global_key_value_heads");
      }
    }
    return;
  }
  if (!perLayerConfig->is_object())
    text.fail("per_layer_config",
              "expected an object mapping layer indices to overrides, got " + describe(*perLayerConfig));
  for (const auto& [key, overrides] : perLayerConfig->items()) {
    const std::string entryField = "per_layer_config." + key;
    const bool allDigits = !key.empty() && key.size() <= 9 && key.find_first_not_of("0123456789") == std::string::npos;
    if (!allDigits || std::stoll(key) >= static_cast<int64_t>(layers.size()))
      text.fail(entryField, "expected a layer index in [0, " + std::to_string(layers.size()) + ")");
    SourcedGeometry& layer = layers[std::stoll(key)];
    if (!overrides.is_object())
      text.fail(entryField, "expected an object of per-layer overrides, got " + describe(overrides));
    FieldReader entry(overrides, text.filePath(), text.fieldName(entryField) + ".");
    for (const auto& [name, value] : overrides.items()) {
      if (name == "head_dim") {
        layer.geometry.headDim = entry.requireEven(name, value);
      } else if (name == "num_key_value_heads") {
        layer.geometry.numKeyValueHeads = entry.requireInteger(name, value, 1, kMaxHeads);
        layer.numKeyValueHeadsField = entry.fieldName(name);
      } else if (name == "num_attention_heads") {
        layer.geometry.numQueryHeads = entry.requireInteger(name, value, 1, kMaxHeads);
        layer.numQueryHeadsField = entry.fieldName(name);
      } else {
        entry.fail(name,
                   "not supported per layer (only head_dim, num_attention_heads and num_key_value_heads may vary)");
      }
    }
  }
  // Writing both spellings is how dgemma exports a config for HF (docs/model.md, "Tiny configs"); say so only when
  // the ignored spelling disagrees with the one used.
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerGeometry& geometry = layers[i].geometry;
    if (geometry.type != AttentionLayerType::Full) continue;
    const bool headDimDiffers = globalHeadDim && *globalHeadDim != geometry.headDim;
    const bool keyValueHeadsDiffer = globalKeyValueHeads && *globalKeyValueHeads != geometry.numKeyValueHeads;
    if (headDimDiffers || keyValueHeadsDiffer) {
      warnings.push_back(
          text.filePath() + ": " + text.fieldName(headDimDiffers ? "global_head_dim" : "num_global_key_value_heads") +
          ": ignored because per_layer_config is present, and it disagrees with full layer " + std::to_string(i));
      break;
    }
  }
}

// A field that plain Gemma 4 lets vary but DiffusionGemma fixes (docs/model.md, "Text config"): HF ignores it, so
// the matching value is accepted with a warning and any other value is refused.
void requireFixedGemma4Field(FieldReader& text, std::string_view key, const json& fixedValue, const std::string& why,
                             std::vector<std::string>& warnings) {
  const json* value = text.find(key);
  if (!value) return;
  if (*value != fixedValue) text.fail(key, "expected " + fixedValue.dump() + " (" + why + "), got " + describe(*value));
  warnings.push_back(text.filePath() + ": " + text.fieldName(key) +
                     ": a Gemma 4 field DiffusionGemma does not have, ignored");
}

int64_t readTokenId(FieldReader& reader, std::string_view key, int64_t defaultValue, int64_t vocabSize) {
  const json* value = reader.find(key);
  if (!value) return defaultValue;
  const std::optional<int64_t> parsed = asInteger(*value);
  if (!parsed || *parsed < 0 || *parsed >= vocabSize)
    reader.fail(key,
                "expected an integer in [0, " + std::to_string(vocabSize) + ") (vocab_size), got " + describe(*value));
  return *parsed;
}

std::optional<std::vector<int64_t>> readEosTokenIds(FieldReader& reader, int64_t vocabSize) {
  const json* value = reader.find("eos_token_id");
  if (!value) return std::nullopt;
  const std::string expectation =
      "expected a token id or a non-empty list of token ids in [0, " + std::to_string(vocabSize) + "), got ";
  const json list = value->is_array() ? *value : json::array({*value});
  if (list.empty()) reader.fail("eos_token_id", expectation + describe(*value));
  std::vector<int64_t> ids;
  for (const json& element : list) {
    const std::optional<int64_t> parsed = asInteger(element);
    if (!parsed || *parsed < 0 || *parsed >= vocabSize) reader.fail("eos_token_id", expectation + describe(element));
    ids.push_back(*parsed);
  }
  return ids;
}

void readTextConfig(FieldReader& text, DiffusionGemmaConfig& config) {
  // docs/model.md, "Config loading rules": "all" would make the encoder non-causal and halve the window; no test covers it yet.
  if (const json* bidirectional = text.find("use_bidirectional_attention")) {
    if (*bidirectional == "all")
      text.fail("use_bidirectional_attention", "\"all\" is not supported (only \"vision\" or null), got \"all\"");
    if (!bidirectional->is_null() && *bidirectional != "vision")
      text.fail("use_bidirectional_attention", "expected \"vision\" or null, got " + describe(*bidirectional));
    config.imageTokensBidirectional = *bidirectional == "vision";
  }

  config.vocabSize = text.integer("vocab_size", kDefaultVocabSize, 1, kMaxVocabSize);
  config.paddedVocabSize = config.vocabSize;
  config.hiddenSize = text.integer("hidden_size", kDefaultHiddenSize, 1, kMaxHiddenSize);
  config.intermediateSize = text.integer("intermediate_size", kDefaultIntermediateSize, 1, kMaxMlpWidth);
  config.numHiddenLayers = text.integer("num_hidden_layers", kDefaultNumHiddenLayers, 1, kMaxLayers);
  const int64_t numAttentionHeads = text.integer("num_attention_heads", kDefaultNumAttentionHeads, 1, kMaxHeads);
  const int64_t numKeyValueHeads = text.integer("num_key_value_heads", kDefaultNumKeyValueHeads, 1, kMaxHeads);
  const int64_t headDim = text.evenInteger("head_dim", kDefaultHeadDim);
  config.maxPositionEmbeddings =
      text.integer("max_position_embeddings", kDefaultMaxPositionEmbeddings, 1, kMaxPositions);
  config.slidingWindow = text.integer("sliding_window", kDefaultSlidingWindow, 1, kMaxPositions);
  config.rmsNormEps = text.positiveNumber("rms_norm_eps", kDefaultRmsNormEps, kMaxRmsNormEps);
  config.finalLogitSoftcapping =
      text.positiveNumber("final_logit_softcapping", kDefaultFinalLogitSoftcapping, kMaxLogitSoftcapping);
  config.initializerRange = text.positiveNumber("initializer_range", kDefaultInitializerRange, kMaxInitializerRange);

  const std::string dense = "DiffusionGemma has routed experts in every layer; a dense config cannot be built";
  config.numExperts = text.integer("num_experts", std::nullopt, 1, kMaxExperts, dense);
  const json* topKValue = text.find("top_k_experts");
  if (!topKValue) text.fail("top_k_experts", "missing; " + dense);
  const std::optional<int64_t> topK = asInteger(*topKValue);
  if (!topK || *topK < 1 || *topK > config.numExperts)
    text.fail("top_k_experts", "expected an integer in [1, " + std::to_string(config.numExperts) +
                                   "] (num_experts), got " + describe(*topKValue));
  config.topKExperts = *topK;
  config.moeIntermediateSize = text.integer("moe_intermediate_size", std::nullopt, 1, kMaxMlpWidth, dense);

  if (const json* activation = text.find("hidden_activation"); activation && *activation != "gelu_pytorch_tanh")
    text.fail("hidden_activation", "expected \"gelu_pytorch_tanh\", got " + describe(*activation));
  if (text.boolean("attention_bias", false))
    text.fail("attention_bias", "expected false (the projections have no bias), got true");
  if (const json* dropout = text.find("attention_dropout");
      dropout && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0))
    text.fail("attention_dropout", "expected 0 (dgemma has no attention dropout), got " + describe(*dropout));
  if (!text.boolean("tie_word_embeddings", true))
    text.fail("tie_word_embeddings", "expected true (the LM head is the embedding), got false");

  if (const json* perLayerInput = text.find("hidden_size_per_layer_input");
      perLayerInput && !perLayerInput->is_null() && *perLayerInput != 0)
    text.fail("hidden_size_per_layer_input",
              "expected 0 or null (DiffusionGemma has no per-layer embeddings), got " + describe(*perLayerInput));
  requireFixedGemma4Field(text, "enable_moe_block", true, "every DiffusionGemma layer has routed experts",
                          config.warnings);
  requireFixedGemma4Field(text, "attention_k_eq_v", true, "full-attention layers always share K and V",
                          config.warnings);
  requireFixedGemma4Field(text, "use_double_wide_mlp", false, "the dense MLP has intermediate_size", config.warnings);
  requireFixedGemma4Field(text, "num_kv_shared_layers", 0, "no layer reuses another layer's K/V", config.warnings);

  config.padTokenId = readTokenId(text, "pad_token_id", kDefaultPadTokenId, config.vocabSize);
  config.bosTokenId = readTokenId(text, "bos_token_id", kDefaultBosTokenId, config.vocabSize);
  config.eosTokenIds = readEosTokenIds(text, config.vocabSize).value_or(std::vector<int64_t>{kDefaultEosTokenId});
  if (text.find("mask_token_id")) config.maskTokenId = readTokenId(text, "mask_token_id", 0, config.vocabSize);

  const std::vector<AttentionLayerType> layerTypes = readLayerTypes(text, config.numHiddenLayers, config.warnings);
  const std::map<AttentionLayerType, RopeParameters> ropeByType = readRopeParameters(text, layerTypes);
  std::vector<SourcedGeometry> layers;
  for (AttentionLayerType type : layerTypes) {
    layers.push_back(
        SourcedGeometry{LayerGeometry{type, headDim, numAttentionHeads, numKeyValueHeads, ropeByType.at(type)},
                        text.fieldName("num_attention_heads"), text.fieldName("num_key_value_heads")});
  }
  applyPerLayerGeometry(text, layers, config.warnings);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerGeometry& geometry = layers[i].geometry;
    if (geometry.numQueryHeads % geometry.numKeyValueHeads != 0)
      throw InputError(text.filePath() + ": " + layers[i].numKeyValueHeadsField + ": expected a divisor of the " +
                       std::to_string(geometry.numQueryHeads) + " query heads (" + layers[i].numQueryHeadsField +
                       ") of layer " + std::to_string(i) + " (" + std::string(layerTypeName(geometry.type)) +
                       "), got " + std::to_string(geometry.numKeyValueHeads));
    config.layers.push_back(geometry);
  }
}

// docs/model.md, "Vision config": HF's Gemma4VisionConfig, class defaults for absent fields.
VisionConfig readVisionConfig(FieldReader& vision) {
  if (const json* modelType = vision.find("model_type"); modelType && *modelType != "gemma4_vision")
    vision.fail("model_type", "expected \"gemma4_vision\", got " + describe(*modelType));
  VisionConfig config;
  config.hiddenSize = vision.integer("hidden_size", config.hiddenSize, 1, kMaxHiddenSize);
  config.intermediateSize = vision.integer("intermediate_size", config.intermediateSize, 1, kMaxMlpWidth);
  config.numHiddenLayers = vision.integer("num_hidden_layers", config.numHiddenLayers, 1, kMaxLayers);
  config.numAttentionHeads = vision.integer("num_attention_heads", config.numAttentionHeads, 1, kMaxHeads);
  config.numKeyValueHeads = vision.integer("num_key_value_heads", config.numKeyValueHeads, 1, kMaxHeads);
  if (config.numAttentionHeads % config.numKeyValueHeads != 0)
    vision.fail("num_key_value_heads", "expected a divisor of the " + std::to_string(config.numAttentionHeads) +
                                           " query heads (num_attention_heads), got " +
                                           std::to_string(config.numKeyValueHeads));
  // 2-D RoPE rotates each half of the head with the rotate-half rule, so each half is even.
  if (const json* headDim = vision.find("head_dim")) {
    const std::optional<int64_t> parsed = asInteger(*headDim);
    if (!parsed || *parsed < 4 || *parsed > kMaxHeadDim || *parsed % 4 != 0)
      vision.fail("head_dim", "expected a multiple of 4 in [4, " + std::to_string(kMaxHeadDim) +
                                  "] (2-D RoPE rotates each half of the head), got " + describe(*headDim));
    config.headDim = *parsed;
  }
  config.rmsNormEps = vision.positiveNumber("rms_norm_eps", config.rmsNormEps, kMaxRmsNormEps);
  if (const json* activation = vision.find("hidden_activation"); activation && *activation != "gelu_pytorch_tanh")
    vision.fail("hidden_activation", "expected \"gelu_pytorch_tanh\", got " + describe(*activation));
  if (vision.boolean("use_clipped_linears", false))
    vision.fail("use_clipped_linears", "expected false (dgemma has no clipped vision linears), got true");
  if (const json* bias = vision.find("attention_bias"); bias && !bias->is_null() && *bias != false)
    vision.fail("attention_bias", "expected false (the projections have no bias), got " + describe(*bias));
  if (const json* dropout = vision.find("attention_dropout");
      dropout && !dropout->is_null() && !(dropout->is_number() && dropout->get<double>() == 0.0))
    vision.fail("attention_dropout", "expected 0 (dgemma has no attention dropout), got " + describe(*dropout));
  if (const json* rope = vision.find("rope_parameters"); rope && !rope->is_null()) {
    if (!rope->is_object()) vision.fail("rope_parameters", "expected an object with rope_type and rope_theta, got " + describe(*rope));
    FieldReader entry(*rope, vision.filePath(), vision.fieldName("rope_parameters") + ".");
    // Older HF versions call the vision RoPE "default", newer ones "axial": the same frequencies.
    if (const json* type = entry.find("rope_type"); type && *type != "default" && *type != "axial")
      entry.fail("rope_type", "expected \"default\" or \"axial\", got " + describe(*type));
    config.ropeTheta = entry.positiveNumber("rope_theta", config.ropeTheta, kMaxRopeTheta);
    for (const auto& [name, value] : rope->items())
      if (name != "rope_type" && name != "rope_theta")
        entry.fail(name, "not supported (the vision RoPE entry takes rope_type and rope_theta)");
  }
  config.patchSize = vision.integer("patch_size", config.patchSize, 1, kMaxPatchSize);
  config.poolingKernelSize = vision.integer("pooling_kernel_size", config.poolingKernelSize, 1, kMaxPoolingKernel);
  config.positionEmbeddingSize =
      vision.integer("position_embedding_size", config.positionEmbeddingSize, 1, kMaxPositions);
  config.standardize = vision.boolean("standardize", config.standardize);
  // Read by HF but not by its vision tower: the pooler's length comes from the processor.
  vision.find("max_position_embeddings");
  vision.find("default_output_length");
  return config;
}

json readJsonFile(const std::string& path) {
  // Not a regular file: a device or FIFO would never end (readWholeFile reads to the end).
  if (!std::filesystem::exists(path)) throw InputError(path + ": cannot open the config file");
  if (!std::filesystem::is_regular_file(path)) throw InputError(path + ": cannot open the config file: not a regular file");
  return parseJson(readWholeFile(path), path);
}

}  // namespace

const LayerGeometry& DiffusionGemmaConfig::layer(int64_t layerIndex) const {
  if (layerIndex < 0 || layerIndex >= static_cast<int64_t>(layers.size()))
    throw std::out_of_range("DiffusionGemmaConfig: layer " + std::to_string(layerIndex) + " of " +
                            std::to_string(layers.size()));
  return layers[layerIndex];
}

int64_t DiffusionGemmaConfig::queryWidth(int64_t layerIndex) const {
  return layer(layerIndex).numQueryHeads * layer(layerIndex).headDim;
}

int64_t DiffusionGemmaConfig::keyValueWidth(int64_t layerIndex) const {
  return layer(layerIndex).numKeyValueHeads * layer(layerIndex).headDim;
}

int64_t DiffusionGemmaConfig::queryHeadsPerKeyValueHead(int64_t layerIndex) const {
  return layer(layerIndex).numQueryHeads / layer(layerIndex).numKeyValueHeads;
}

int64_t DiffusionGemmaConfig::ropeRotatedPairs(int64_t layerIndex) const {
  const LayerGeometry& geometry = layer(layerIndex);
  if (geometry.rope.type == RopeType::Default) return geometry.headDim / 2;
  // HF: int(partial_rotary_factor * head_dim // 2), floor division on a Python float.
  return static_cast<int64_t>(
      std::floor(geometry.rope.partialRotaryFactor * static_cast<double>(geometry.headDim) / 2.0));
}

double DiffusionGemmaConfig::embeddingScale(DType embeddingDType) const {
  // HF keeps hidden_size ** 0.5 as a float32 tensor and casts it to the embedding dtype at use, so
  // every dtype starts from the float32 value (a float64 model gets the widened float32 value).
  const float scale = static_cast<float>(std::sqrt(static_cast<double>(hiddenSize)));
  switch (embeddingDType) {
    case DType::F32:
    case DType::F64:
      return scale;
    case DType::BF16:
      return bf16BitsToF32(f32ToBf16Bits(scale));
    case DType::F16:
      return f16BitsToF32(f32ToF16Bits(scale));
    default:
      throw std::invalid_argument("embeddingScale: the embedding dtype must be floating, got " +
                                  std::string(dtypeName(embeddingDType)));
  }
}

DiffusionGemmaConfig loadDiffusionGemmaConfig(const std::string& pathToConfigJsonOrDir) {
  const std::string path = std::filesystem::is_directory(pathToConfigJsonOrDir)
                               ? (std::filesystem::path(pathToConfigJsonOrDir) / "config.json").string()
                               : pathToConfigJsonOrDir;
  return parseDiffusionGemmaConfig(readJsonFile(path), path);
}

DiffusionGemmaConfig parseDiffusionGemmaConfigText(std::string_view text, const std::string& source) {
  return parseDiffusionGemmaConfig(parseJson(text, source), source);
}

DiffusionGemmaConfig parseDiffusionGemmaConfig(const json& root, const std::string& path) {
  if (!root.is_object()) throw InputError(path + ": expected a JSON object at the top level, got " + describe(root));
  FieldReader top(root, path, "");

  const json* modelType = top.find("model_type");
  bool isTopLevel = root.contains("text_config");
  if (modelType) {
    if (*modelType == "diffusion_gemma") {
      isTopLevel = true;
    } else if (*modelType == "diffusion_gemma_text") {
      isTopLevel = false;
    } else {
      top.fail("model_type", "expected \"diffusion_gemma\" or \"diffusion_gemma_text\", got " + describe(*modelType));
    }
  }

  DiffusionGemmaConfig config;
  if (!isTopLevel) {
    readTextConfig(top, config);
    top.warnAboutUnreadKeys(config.warnings);
    config.canvasLength = kDefaultCanvasLength;
    config.boiTokenId = kDefaultBoiTokenId;
    config.eoiTokenId = kDefaultEoiTokenId;
    config.imageTokenId = kDefaultImageTokenId;
    return config;
  }

  const json* textConfig = top.find("text_config");
  if (!textConfig || textConfig->is_null())
    top.fail("text_config", "missing; the default text config has no MoE sizes, so it cannot be built");
  if (!textConfig->is_object()) top.fail("text_config", "expected an object, got " + describe(*textConfig));
  FieldReader text(*textConfig, path, "text_config.");
  if (const json* textModelType = text.find("model_type"); textModelType && *textModelType != "diffusion_gemma_text")
    text.fail("model_type", "expected \"diffusion_gemma_text\", got " + describe(*textModelType));
  readTextConfig(text, config);
  text.warnAboutUnreadKeys(config.warnings);

  for (const std::string& key : kAudioVideoFields) {
    if (const json* value = top.find(key); value && !value->is_null())
      top.fail(key, "expected null or absent (DiffusionGemma has no audio or video input), got " + describe(*value));
  }
  if (const json* vision = top.find("vision_config")) {
    if (!vision->is_null() && !vision->is_object())
      top.fail("vision_config", "expected an object or null, got " + describe(*vision));
    config.hasVision = vision->is_object();
    if (config.hasVision) {
      FieldReader visionFields(*vision, path, "vision_config.");
      config.vision = readVisionConfig(visionFields);
      visionFields.warnAboutUnreadKeys(config.warnings);
    }
  }
  config.maxSoftTokensPerImage =
      top.integer("vision_soft_tokens_per_image", kDefaultSoftTokensPerImage, 1, kMaxSoftTokensPerImage);
  config.canvasLength = top.integer("canvas_length", kDefaultCanvasLength, 1, kMaxCanvasLength);
  config.boiTokenId = readTokenId(top, "boi_token_id", kDefaultBoiTokenId, config.vocabSize);
  config.eoiTokenId = readTokenId(top, "eoi_token_id", kDefaultEoiTokenId, config.vocabSize);
  config.imageTokenId = readTokenId(top, "image_token_id", kDefaultImageTokenId, config.vocabSize);
  if (std::optional<std::vector<int64_t>> eosTokenIds = readEosTokenIds(top, config.vocabSize))
    config.eosTokenIds = *eosTokenIds;
  config.tieWordEmbeddings = top.boolean("tie_word_embeddings", true);
  if (!config.tieWordEmbeddings)
    top.fail("tie_word_embeddings",
             "expected true (the encoder text stack, the decoder and the LM head share weights), got false");
  top.warnAboutUnreadKeys(config.warnings);
  return config;
}

}  // namespace dgemma
