#include "models/diffusion_gemma/spec/WeightSchema.h"

#include <cstring>
#include <optional>
#include <set>
#include <sstream>

#include "support/Error.h"

namespace dgemma {

namespace {

constexpr std::string_view kSelfConditioningPrefix = "self_conditioning.";

std::string decoderName(const std::string& suffix) { return std::string(kDecoderPrefix) + suffix; }

std::string layerSuffix(int64_t layerIndex, const std::string& rest) {
  return "layers." + std::to_string(layerIndex) + "." + rest;
}

bool startsWith(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

bool bitIdentical(const SafetensorsLocation& a, const SafetensorsLocation& b) {
  return a.entry->dtype == b.entry->dtype && a.entry->shape == b.entry->shape && a.entry->bytes == b.entry->bytes &&
         std::memcmp(a.file->data(*a.entry), b.file->data(*b.entry), a.entry->bytes) == 0;
}

// The problems with one stored copy of an expected tensor, or none.
std::optional<std::string> checkStoredTensor(const std::string& storedName, const SafetensorsLocation& location,
                                             const ExpectedTensor& expected) {
  if (location.entry->shape != expected.shape)
    return "tensor " + storedName + ": expected shape " + shapeToString(expected.shape) + ", found " +
           shapeToString(location.entry->shape) + " (in " + location.file->path() + ")";
  if (!isFloating(location.entry->dtype))
    return "tensor " + storedName + ": expected a floating dtype, found " +
           std::string(dtypeName(location.entry->dtype)) + " (in " + location.file->path() + ")";
  return std::nullopt;
}

}  // namespace

std::vector<ExpectedTensor> expectedTextWeights(const DiffusionGemmaConfig& config) {
  const int64_t hidden = config.hiddenSize;
  const int64_t experts = config.numExperts;
  const int64_t expertWidth = config.moeIntermediateSize;
  const int64_t denseWidth = config.intermediateSize;
  std::vector<ExpectedTensor> tensors;
  auto add = [&](const std::string& suffix, std::vector<int64_t> shape, bool isBuffer = false) {
    tensors.push_back(ExpectedTensor{decoderName(suffix), std::move(shape), isBuffer});
  };
  for (int64_t i = 0; i < config.numHiddenLayers; ++i) {
    const int64_t headDim = config.layer(i).headDim;
    add(layerSuffix(i, "self_attn.q_proj.weight"), {config.queryWidth(i), hidden});
    add(layerSuffix(i, "self_attn.k_proj.weight"), {config.keyValueWidth(i), hidden});
    if (config.hasValueProjection(i)) add(layerSuffix(i, "self_attn.v_proj.weight"), {config.keyValueWidth(i), hidden});
    add(layerSuffix(i, "self_attn.o_proj.weight"), {hidden, config.queryWidth(i)});
    add(layerSuffix(i, "self_attn.q_norm.weight"), {headDim});
    add(layerSuffix(i, "self_attn.k_norm.weight"), {headDim});
    for (const char* norm :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm_1",
          "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2", "post_feedforward_layernorm"})
      add(layerSuffix(i, std::string(norm) + ".weight"), {hidden});
    add(layerSuffix(i, "mlp.gate_proj.weight"), {denseWidth, hidden});
    add(layerSuffix(i, "mlp.up_proj.weight"), {denseWidth, hidden});
    add(layerSuffix(i, "mlp.down_proj.weight"), {hidden, denseWidth});
    add(layerSuffix(i, "router.proj.weight"), {experts, hidden});
    add(layerSuffix(i, "router.scale"), {hidden});
    add(layerSuffix(i, "router.per_expert_scale"), {experts});
    // Gate rows then up rows along dim 1 (blocks, not interleaved); no ".weight" suffix.
    add(layerSuffix(i, "experts.gate_up_proj"), {experts, 2 * expertWidth, hidden});
    add(layerSuffix(i, "experts.down_proj"), {experts, hidden, expertWidth});
    add(layerSuffix(i, "layer_scalar"), {1}, /*isBuffer=*/true);
  }
  add("embed_tokens.weight", {config.vocabSize, hidden});
  add("norm.weight", {hidden});
  add("self_conditioning.pre_norm.weight", {hidden});
  add("self_conditioning.gate_proj.weight", {denseWidth, hidden});
  add("self_conditioning.up_proj.weight", {denseWidth, hidden});
  add("self_conditioning.down_proj.weight", {hidden, denseWidth});
  return tensors;
}

std::vector<ExpectedTensor> expectedVisionWeights(const DiffusionGemmaConfig& config) {
  std::vector<ExpectedTensor> tensors;
  if (!config.hasVision) return tensors;
  const VisionConfig& vision = config.vision;
  const int64_t hidden = vision.hiddenSize, inner = vision.intermediateSize;
  const int64_t queryWidth = vision.numAttentionHeads * vision.headDim, keyValueWidth = vision.numKeyValueHeads * vision.headDim;
  auto add = [&](const std::string& suffix, std::vector<int64_t> shape, bool isBuffer = false) {
    tensors.push_back(ExpectedTensor{std::string(kVisionTowerPrefix) + suffix, std::move(shape), isBuffer});
  };
  for (int64_t i = 0; i < vision.numHiddenLayers; ++i) {
    const std::string layer = "encoder.layers." + std::to_string(i) + ".";
    add(layer + "self_attn.q_proj.linear.weight", {queryWidth, hidden});
    add(layer + "self_attn.k_proj.linear.weight", {keyValueWidth, hidden});
    add(layer + "self_attn.v_proj.linear.weight", {keyValueWidth, hidden});
    add(layer + "self_attn.o_proj.linear.weight", {hidden, queryWidth});
    add(layer + "self_attn.q_norm.weight", {vision.headDim});
    add(layer + "self_attn.k_norm.weight", {vision.headDim});
    add(layer + "mlp.gate_proj.linear.weight", {inner, hidden});
    add(layer + "mlp.up_proj.linear.weight", {inner, hidden});
    add(layer + "mlp.down_proj.linear.weight", {hidden, inner});
    for (const char* norm :
         {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"})
      add(layer + norm + ".weight", {hidden});
  }
  add("patch_embedder.input_proj.weight", {hidden, vision.patchDim()});
  add("patch_embedder.position_embedding_table", {2, vision.positionEmbeddingSize, hidden});
  if (vision.standardize) {
    add("std_bias", {hidden}, /*isBuffer=*/true);
    add("std_scale", {hidden}, /*isBuffer=*/true);
  }
  tensors.push_back(ExpectedTensor{std::string(kVisionEmbedderPrefix) + "embedding_projection.weight",
                                   {config.hiddenSize, hidden}, false});
  return tensors;
}

ResolvedCheckpoint resolveCheckpointNames(const DiffusionGemmaConfig& config, const SafetensorsDirectory& checkpoint,
                                          const std::function<bool(const std::string&)>& needed) {
  ResolvedCheckpoint resolved;
  std::vector<std::string> problems;
  std::set<std::string> accountedFor;  // checkpoint names that some rule has claimed

  for (const ExpectedTensor& expected : expectedTextWeights(config)) {
    const std::string suffix = expected.name.substr(kDecoderPrefix.size());
    // The self-conditioning block exists only in the decoder (docs/model.md, "Tying").
    const bool hasEncoderCopy = !startsWith(suffix, kSelfConditioningPrefix);
    const std::string encoderName = std::string(kEncoderTextPrefix) + suffix;
    const std::optional<SafetensorsLocation> decoderCopy = checkpoint.find(expected.name);
    const std::optional<SafetensorsLocation> encoderCopy =
        hasEncoderCopy ? checkpoint.find(encoderName) : std::optional<SafetensorsLocation>();
    if (decoderCopy) accountedFor.insert(expected.name);
    if (encoderCopy) accountedFor.insert(encoderName);
    if (!decoderCopy && !encoderCopy) {
      if (!needed || needed(expected.name))
        problems.push_back("missing tensor " + expected.name + " " + shapeToString(expected.shape));
      continue;
    }
    bool usable = true;
    for (const auto& [storedName, copy] :
         {std::pair{expected.name, decoderCopy}, std::pair{encoderName, encoderCopy}}) {
      if (!copy) continue;
      if (std::optional<std::string> problem = checkStoredTensor(storedName, *copy, expected)) {
        problems.push_back(*problem);
        usable = false;
      }
    }
    if (!usable) continue;
    if (decoderCopy && encoderCopy && !bitIdentical(*decoderCopy, *encoderCopy)) {
      problems.push_back("tensors " + expected.name + " and " + encoderName +
                         " differ; the encoder and decoder copies must be bit-identical");
      continue;
    }
    resolved.textTensors.emplace(expected.name, decoderCopy ? *decoderCopy : *encoderCopy);
  }

  const std::string lmHead(kLmHeadName);
  if (const std::optional<SafetensorsLocation> head = checkpoint.find(lmHead)) {
    accountedFor.insert(lmHead);
    const std::string embeddingName = decoderName("embed_tokens.weight");
    const auto embedding = resolved.textTensors.find(embeddingName);
    // Without a usable embedding its own problem is already listed; there is nothing to compare.
    if (embedding != resolved.textTensors.end() && !bitIdentical(*head, embedding->second))
      problems.push_back("tensor " + lmHead + ": differs from " + embeddingName +
                         "; the LM head is tied to the embedding, so a stored copy must be bit-identical");
  }

  std::set<std::string> valueProjectionsOfFullLayers;
  for (int64_t i = 0; i < config.numHiddenLayers; ++i) {
    if (config.hasValueProjection(i)) continue;
    const std::string suffix = layerSuffix(i, "self_attn.v_proj.weight");
    valueProjectionsOfFullLayers.insert(decoderName(suffix));
    valueProjectionsOfFullLayers.insert(std::string(kEncoderTextPrefix) + suffix);
  }
  std::map<std::string, ExpectedTensor> visionSchema;
  for (const ExpectedTensor& expected : expectedVisionWeights(config)) visionSchema.emplace(expected.name, expected);
  for (const std::string& name : checkpoint.names()) {
    if (accountedFor.count(name)) continue;
    if (startsWith(name, kVisionTowerPrefix) || startsWith(name, kVisionEmbedderPrefix)) {
      resolved.visionTensorNames.push_back(name);
      if (!config.hasVision) continue;  // a text-only model ignores them
      const auto expected = visionSchema.find(name);
      const SafetensorsLocation location = *checkpoint.find(name);
      if (expected == visionSchema.end())
        problems.push_back("unexpected tensor " + name + " (not a vision tensor of this vision_config; in " +
                           location.file->path() + ")");
      else if (std::optional<std::string> problem = checkStoredTensor(name, location, expected->second))
        problems.push_back(*problem);
      else
        resolved.visionTensors.emplace(name, location);
    } else if (valueProjectionsOfFullLayers.count(name)) {
      problems.push_back("unexpected tensor " + name + " (a full-attention layer has no v_proj: V comes from k_proj)");
    } else {
      problems.push_back("unexpected tensor " + name + " (in " + checkpoint.find(name)->file->path() + ")");
    }
  }

  if (!problems.empty()) {
    std::ostringstream message;
    message << checkpoint.path() << ": " << problems.size() << " problem(s) with the " << (config.hasVision ? "" : "text ") << "weights:";
    for (const std::string& problem : problems) message << "\n  " << problem;
    throw InputError(message.str());
  }
  return resolved;
}

}  // namespace dgemma

std::string_view dgemma::tensorParallelRole(std::string_view name) {
  auto endsWith = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (name == std::string(kDecoderPrefix) + "embed_tokens.weight") return "vocab";
  for (std::string_view column : {".self_attn.q_proj.weight", ".self_attn.k_proj.weight", ".self_attn.v_proj.weight",
                                  ".mlp.gate_proj.weight", ".mlp.up_proj.weight"})
    if (endsWith(column)) return "column";
  if (endsWith(".self_attn.o_proj.weight") || endsWith(".mlp.down_proj.weight")) return "row";
  if (endsWith(".experts.gate_up_proj") || endsWith(".experts.down_proj")) return "experts";
  return "replicated";
}
