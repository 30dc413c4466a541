#include "runtime/model/diffusion_gemma/PeftAdapter.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/io/Safetensors.h"
#include "support/AtomicFile.h"
#include "support/Error.h"
#include "support/Json.h"
#include "support/Shape.h"

namespace dgemma {

namespace fs = std::filesystem;

namespace {

// PeftModel's prefix before the wrapped model's own module names.
constexpr std::string_view kPeftPrefix = "base_model.model.";
constexpr std::string_view kLinearA = ".lora_A.weight";
constexpr std::string_view kLinearB = ".lora_B.weight";
constexpr std::string_view kExpertA = ".lora_A";
constexpr std::string_view kExpertB = ".lora_B";
constexpr std::string_view kExperts = ".experts.";
constexpr const char* kGateUpTarget = "experts.gate_up_proj";
constexpr const char* kDownTarget = "experts.down_proj";

// The single target names of linear modules, in the order target_modules lists them, each with the
// parent module it lives in.
struct LinearTarget {
  const char* name;
  const char* parent;  // self_attn, mlp, router
  const char* module;  // the name under the parent
};
constexpr LinearTarget kLinearTargets[] = {
    {"q_proj", "self_attn", "q_proj"}, {"k_proj", "self_attn", "k_proj"}, {"v_proj", "self_attn", "v_proj"},
    {"o_proj", "self_attn", "o_proj"}, {"gate_proj", "mlp", "gate_proj"}, {"up_proj", "mlp", "up_proj"},
    {"down_proj", "mlp", "down_proj"}, {"router.proj", "router", "proj"},
};

bool endsWith(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool startsWith(std::string_view text, std::string_view prefix) { return text.rfind(prefix, 0) == 0; }

bool targets(const AdapterSettings& settings, const std::string& name) {
  return std::find(settings.targets.begin(), settings.targets.end(), name) != settings.targets.end();
}

// The regular expression of target_modules for the linear targets `names` (a subset of
// kLinearTargets' names); empty when there are none.
std::string targetModulesRegex(const std::set<std::string>& names) {
  std::map<std::string, std::vector<std::string>> modulesByParent;
  std::vector<std::string> parentOrder;
  for (const LinearTarget& target : kLinearTargets) {
    if (!names.count(target.name)) continue;
    if (!modulesByParent.count(target.parent)) parentOrder.push_back(target.parent);
    modulesByParent[target.parent].push_back(target.module);
  }
  if (parentOrder.empty()) return "";
  std::string alternatives;
  for (const std::string& parent : parentOrder) {
    const std::vector<std::string>& modules = modulesByParent[parent];
    std::string part = parent + "\\.";
    if (modules.size() == 1) {
      part += modules.front();
    } else {
      part += "(?:";
      for (size_t i = 0; i < modules.size(); ++i) part += (i ? "|" : "") + modules[i];
      part += ")";
    }
    alternatives += (alternatives.empty() ? "" : "|") + part;
  }
  // Only the text layers of the encoder and the decoder: the vision tower has q_proj, mlp.* too, and
  // the decoder's self_conditioning has gate_proj/up_proj/down_proj outside `layers`.
  return "model\\.(?:encoder\\.language_model|decoder)\\.layers\\.\\d+\\.(?:" + alternatives + ")";
}

std::set<std::string> linearTargetNames(const AdapterSettings& settings) {
  std::set<std::string> names;
  for (const LinearTarget& target : kLinearTargets)
    if (targets(settings, target.name)) names.insert(target.name);
  return names;
}

std::string encoderTwin(const std::string& decoderName) {
  return std::string(kEncoderTextPrefix) + decoderName.substr(kDecoderPrefix.size());
}

// One error for every problem found with an adapter directory.
void throwIfProblems(const std::string& what, const std::vector<std::string>& problems) {
  if (problems.empty()) return;
  std::ostringstream message;
  message << what << ": " << problems.size() << " problem(s) with the adapter:";
  for (const std::string& problem : problems) message << "\n  " << problem;
  throw InputError(message.str());
}

nlohmann::json readConfig(const std::string& directory) {
  const fs::path path = fs::path(directory) / kPeftConfigFileName;
  if (!fs::is_directory(directory))
    throw InputError(directory + ": expected an adapter directory (adapter_config.json, adapter_model.safetensors)");
  if (!fs::exists(path)) throw InputError(path.string() + ": missing (expected a PEFT adapter directory)");
  const nlohmann::json config = parseJson(readWholeFile(path.string()), path.string());
  if (!config.is_object())
    throw InputError(path.string() + ": expected a JSON object, got " + describeJsonValue(config));
  return config;
}

// PEFT's expert wrappers nest when both expert tensors are targeted: gate_up_proj's is the inner one
// (base_layer), down_proj's the outer (tuners_utils walks the experts module's parameters in order).
std::string expertModuleKey(const std::string& experts, const std::string& tensor, const AdapterSettings& settings) {
  const bool nested = targets(settings, kGateUpTarget) && targets(settings, kDownTarget);
  return experts + (nested && tensor == "gate_up_proj" ? ".base_layer" : "");
}

}  // namespace

bool isLoraParameterName(const std::string& name) {
  // A train plan's gradient buffers (grad/<name>) and optimizer state end the same way.
  if (!startsWith(name, kDecoderPrefix)) return false;
  if (endsWith(name, kLinearA) || endsWith(name, kLinearB)) return true;
  return name.find(kExperts) != std::string::npos &&
         (endsWith(name, std::string(".gate_up_proj") + std::string(kExpertA)) ||
          endsWith(name, std::string(".gate_up_proj") + std::string(kExpertB)) ||
          endsWith(name, std::string(".down_proj") + std::string(kExpertA)) ||
          endsWith(name, std::string(".down_proj") + std::string(kExpertB)));
}

PeftKeys peftKeysOf(const std::string& planName, const AdapterSettings& settings) {
  if (!startsWith(planName, kDecoderPrefix) || !isLoraParameterName(planName))
    throw InputError("adapter parameter " + quoteForMessage(planName) +
                     ": expected model.decoder.<module>.lora_A.weight / lora_B.weight or "
                     "model.decoder.layers.N.experts.<gate_up_proj|down_proj>.lora_A / lora_B");
  PeftKeys keys;
  std::string decoderKey;
  if (endsWith(planName, kLinearA) || endsWith(planName, kLinearB)) {
    decoderKey = planName;
    keys.layout = PeftLayout::Linear;
  } else {
    // model.decoder.layers.N.experts.<tensor>.lora_X
    const bool isA = endsWith(planName, kExpertA);
    const std::string withoutFactor = planName.substr(0, planName.size() - kExpertA.size());
    const size_t dot = withoutFactor.rfind('.');
    const std::string experts = withoutFactor.substr(0, dot), tensor = withoutFactor.substr(dot + 1);
    decoderKey = expertModuleKey(experts, tensor, settings) + (isA ? ".lora_A.weight" : ".lora_B.weight");
    keys.layout = isA ? PeftLayout::ExpertA : PeftLayout::ExpertB;
  }
  keys.decoderKey = std::string(kPeftPrefix) + decoderKey;
  keys.encoderKey = std::string(kPeftPrefix) + encoderTwin(decoderKey);
  return keys;
}

std::vector<int64_t> peftShapeOf(const std::vector<int64_t>& planShape, PeftLayout layout) {
  switch (layout) {
    case PeftLayout::Linear: return planShape;
    case PeftLayout::ExpertA:  // [E, r, in] -> [E*r, in]
      return {planShape.at(0) * planShape.at(1), planShape.at(2)};
    case PeftLayout::ExpertB:  // [E, out, r] -> [out, r*E]
      return {planShape.at(1), planShape.at(2) * planShape.at(0)};
  }
  return planShape;
}

HostTensor toPeftLayout(const HostTensor& planTensor, PeftLayout layout) {
  HostTensor wide = convertDType(planTensor, DType::F64, "adapter tensor");
  HostTensor out(DType::F64, peftShapeOf(planTensor.shape, layout));
  if (layout != PeftLayout::ExpertB) {
    out.data = wide.data;  // the same row-major elements
  } else {
    const int64_t experts = planTensor.shape[0], rows = planTensor.shape[1], rank = planTensor.shape[2];
    const double* in = wide.as<double>();
    double* to = out.as<double>();
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t k = 0; k < rank; ++k) to[o * rank * experts + k * experts + e] = in[(e * rows + o) * rank + k];
  }
  return convertDType(out, DType::F32, "adapter tensor");
}

HostTensor fromPeftLayout(const HostTensor& peftTensor, PeftLayout layout, const std::vector<int64_t>& planShape) {
  HostTensor wide = convertDType(peftTensor, DType::F64, "adapter tensor");
  HostTensor out(DType::F64, planShape);
  if (layout != PeftLayout::ExpertB) {
    out.data = wide.data;
  } else {
    const int64_t experts = planShape[0], rows = planShape[1], rank = planShape[2];
    const double* in = wide.as<double>();
    double* to = out.as<double>();
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t k = 0; k < rank; ++k) to[(e * rows + o) * rank + k] = in[o * rank * experts + k * experts + e];
  }
  return convertDType(out, DType::F32, "adapter tensor");
}

nlohmann::json peftTargetModules(const AdapterSettings& settings) {
  const std::string regex = targetModulesRegex(linearTargetNames(settings));
  return regex.empty() ? nlohmann::json() : nlohmann::json(regex);
}

nlohmann::ordered_json peftAdapterConfig(const AdapterSettings& settings, const std::string& baseModel) {
  nlohmann::ordered_json targetParameters = nlohmann::ordered_json::array();
  for (const char* tensor : {kGateUpTarget, kDownTarget})
    if (targets(settings, tensor)) targetParameters.push_back(tensor);
  // An integral alpha is written as PEFT writes its int default.
  const nlohmann::ordered_json alpha = settings.alpha == std::floor(settings.alpha) && std::abs(settings.alpha) < 1e15
                                           ? nlohmann::ordered_json(static_cast<int64_t>(settings.alpha))
                                           : nlohmann::ordered_json(settings.alpha);
  return {{"alpha_pattern", nlohmann::ordered_json::object()},
          {"base_model_name_or_path", baseModel},
          {"bias", "none"},
          {"exclude_modules", nullptr},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"init_lora_weights", true},
          {"layers_pattern", nullptr},
          {"layers_to_transform", nullptr},
          {"lora_alpha", alpha},
          {"lora_bias", false},
          {"lora_dropout", settings.dropout},
          {"modules_to_save", nullptr},
          {"peft_type", "LORA"},
          {"peft_version", kPeftFormatVersion},
          {"r", settings.rank},
          {"rank_pattern", nlohmann::ordered_json::object()},
          {"revision", nullptr},
          {"target_modules", peftTargetModules(settings)},
          {"target_parameters", targetParameters.empty() ? nlohmann::ordered_json() : targetParameters},
          {"task_type", nullptr},
          {"use_dora", false},
          {"use_rslora", false}};
}

std::vector<std::pair<std::string, std::string>> peftAdapterFiles(const AdapterSettings& settings,
                                                                  const std::string& baseModel,
                                                                  const std::map<std::string, HostTensor>& tensors) {
  // Sorted by key, as PEFT's save (a dict of the state) leaves no order to match.
  std::map<std::string, HostTensor> byKey;
  for (const auto& [name, tensor] : tensors) {
    const PeftKeys keys = peftKeysOf(name, settings);
    HostTensor peft = toPeftLayout(tensor, keys.layout);
    byKey.emplace(keys.encoderKey, peft);
    byKey.emplace(keys.decoderKey, std::move(peft));
  }
  std::vector<std::pair<std::string, const HostTensor*>> ordered;
  for (const auto& [key, tensor] : byKey) ordered.emplace_back(key, &tensor);
  return {{kPeftWeightsFileName, safetensorsBytes(kPeftWeightsFileName, ordered, {{"format", "pt"}})},
          {kPeftConfigFileName, peftAdapterConfig(settings, baseModel).dump(2) + "\n"}};
}

void writePeftAdapterDirectory(const std::string& directory, const AdapterSettings& settings,
                               const std::string& baseModel, const std::map<std::string, HostTensor>& tensors) {
  const std::vector<std::pair<std::string, std::string>> files = peftAdapterFiles(settings, baseModel, tensors);
  createOutputDirectory(directory, "adapter directory");
  // The weights before the config: a directory with a config always has its weights.
  for (const auto& [name, bytes] : files) writeFileAtomically((fs::path(directory) / name).string(), bytes);
  syncDirectory(directory);
}

AdapterSettings readPeftAdapterSettings(const std::string& directory) {
  const nlohmann::json config = readConfig(directory);
  const std::string file = (fs::path(directory) / kPeftConfigFileName).string();
  auto field = [&](const char* key) -> const nlohmann::json* {
    auto found = config.find(key);
    return found == config.end() || found->is_null() ? nullptr : &*found;
  };
  auto fail = [&](const char* key, const std::string& expected) -> InputError {
    const nlohmann::json* value = field(key);
    return InputError(file + ": " + key + ": expected " + expected + ", got " +
                      (value ? describeJsonValue(*value) : std::string("nothing")));
  };
  const nlohmann::json* type = field("peft_type");
  if (!type || *type != "LORA") throw fail("peft_type", "\"LORA\"");
  AdapterSettings settings;
  const nlohmann::json* rank = field("r");
  if (!rank || !rank->is_number_integer() || rank->get<int64_t>() < 1) throw fail("r", "a positive integer");
  settings.rank = rank->get<int64_t>();
  const nlohmann::json* alpha = field("lora_alpha");
  if (!alpha || !alpha->is_number()) throw fail("lora_alpha", "a number");
  settings.alpha = alpha->get<double>();
  if (const nlohmann::json* dropout = field("lora_dropout")) {
    if (!dropout->is_number()) throw fail("lora_dropout", "a number");
    settings.dropout = dropout->get<double>();
  }
  // What would change W + (alpha/r)·B·A into something else is refused, not ignored.
  for (const char* flag : {"use_rslora", "use_dora", "fan_in_fan_out", "lora_bias"})
    if (const nlohmann::json* value = field(flag); value && *value != false)
      throw fail(flag, "false (dgemma applies plain LoRA)");
  if (const nlohmann::json* bias = field("bias"); bias && *bias != "none") throw fail("bias", "\"none\"");
  for (const char* pattern : {"rank_pattern", "alpha_pattern"})
    if (const nlohmann::json* value = field(pattern); value && !(value->is_object() && value->empty()))
      throw fail(pattern, "{} (one rank and alpha for every target)");
  for (const char* unsupported : {"modules_to_save", "layers_to_transform", "exclude_modules"})
    if (const nlohmann::json* value = field(unsupported); value && !(value->is_array() && value->empty()))
      throw fail(unsupported, "null");

  if (const nlohmann::json* modules = field("target_modules")) {
    if (modules->is_string()) {
      // dgemma's own regular expression for some subset of the linear targets.
      bool matched = false;
      const size_t count = std::size(kLinearTargets);
      for (uint32_t subset = 1; subset < (1u << count) && !matched; ++subset) {
        std::set<std::string> names;
        for (size_t i = 0; i < count; ++i)
          if (subset & (1u << i)) names.insert(kLinearTargets[i].name);
        if (targetModulesRegex(names) != modules->get<std::string>()) continue;
        matched = true;
        for (const LinearTarget& target : kLinearTargets)
          if (names.count(target.name)) settings.targets.push_back(target.name);
      }
      if (!matched)
        throw fail("target_modules", "the regular expression dgemma writes for its targets, or a list of them");
    } else if (modules->is_array()) {
      for (const nlohmann::json& name : *modules) {
        const auto known = std::find_if(
            std::begin(kLinearTargets), std::end(kLinearTargets),
            [&](const LinearTarget& target) { return name.is_string() && name.get<std::string>() == target.name; });
        if (known == std::end(kLinearTargets))
          throw fail("target_modules",
                     "names among q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, router.proj");
        settings.targets.push_back(known->name);
      }
    } else {
      throw fail("target_modules", "a string or a list of module names");
    }
  }
  if (const nlohmann::json* parameters = field("target_parameters")) {
    if (!parameters->is_array()) throw fail("target_parameters", "a list");
    for (const nlohmann::json& name : *parameters) {
      if (name != kGateUpTarget && name != kDownTarget)
        throw fail("target_parameters", "\"experts.gate_up_proj\" and/or \"experts.down_proj\"");
      settings.targets.push_back(name.get<std::string>());
    }
  }
  if (settings.targets.empty()) throw fail("target_modules", "some target (target_modules or target_parameters)");
  return settings;
}

std::map<std::string, HostTensor> readPeftAdapterDirectory(
    const std::string& directory, const AdapterSettings& settings,
    const std::map<std::string, std::vector<int64_t>>& expected) {
  const std::string configFile = (fs::path(directory) / kPeftConfigFileName).string();
  const AdapterSettings saved = readPeftAdapterSettings(directory);
  if (saved.rank != settings.rank)
    throw InputError(configFile + ": r: the adapter has rank " + std::to_string(saved.rank) + ", the plan " +
                     std::to_string(settings.rank) + " (dgemma-compile --lora RANK)");
  if (saved.alpha != settings.alpha)
    throw InputError(configFile + ": lora_alpha: the adapter has " + nlohmann::json(saved.alpha).dump() +
                     ", the plan " + nlohmann::json(settings.alpha).dump() + " (dgemma-compile --lora RANK:ALPHA)");
  std::set<std::string> savedTargets(saved.targets.begin(), saved.targets.end());
  std::set<std::string> planTargets(settings.targets.begin(), settings.targets.end());
  if (savedTargets != planTargets) {
    auto join = [](const std::set<std::string>& names) {
      std::string text;
      for (const std::string& name : names) text += (text.empty() ? "" : ",") + name;
      return text;
    };
    throw InputError(configFile + ": target_modules/target_parameters: the adapter targets " + join(savedTargets) +
                     ", the plan " + join(planTargets) + " (dgemma-compile --lora-targets)");
  }

  const std::string weightsFile = (fs::path(directory) / kPeftWeightsFileName).string();
  if (!fs::exists(weightsFile)) throw InputError(weightsFile + ": missing (expected a PEFT adapter directory)");
  const SafetensorsFile file = SafetensorsFile::open(weightsFile);
  std::vector<std::string> problems;
  std::set<std::string> known;
  std::map<std::string, HostTensor> tensors;
  for (const auto& [name, planShape] : expected) {
    const PeftKeys keys = peftKeysOf(name, settings);
    known.insert(keys.decoderKey);
    known.insert(keys.encoderKey);
    const std::vector<int64_t> shape = peftShapeOf(planShape, keys.layout);
    std::optional<HostTensor> decoder, encoder;
    for (const auto& [key, value] : {std::pair{keys.decoderKey, &decoder}, std::pair{keys.encoderKey, &encoder}}) {
      const SafetensorsEntry* entry = file.find(key);
      if (!entry) {
        problems.push_back(weightsFile + ": missing key " + key + " " + shapeToString(shape) + " (plan parameter " +
                           name + ")");
        continue;
      }
      if (entry->shape != shape) {
        problems.push_back(weightsFile + ": key " + key + ": expected shape " + shapeToString(shape) + ", found " +
                           shapeToString(entry->shape));
        continue;
      }
      if (!isFloating(entry->dtype)) {
        problems.push_back(weightsFile + ": key " + key + ": expected a float dtype, found " +
                           std::string(dtypeName(entry->dtype)));
        continue;
      }
      *value = convertDType(file.read(key), DType::F32, weightsFile + ": key " + key);
    }
    if (!decoder || !encoder) continue;
    // dgemma has one adapter for the tied encoder and decoder weights: two different ones cannot be
    // represented, so they are refused rather than one of them silently dropped.
    if (decoder->data != encoder->data) {
      problems.push_back(weightsFile + ": key " + keys.encoderKey + " differs from " + keys.decoderKey +
                         " (dgemma applies one adapter to the tied encoder and decoder weights)");
      continue;
    }
    tensors.emplace(name, fromPeftLayout(*decoder, keys.layout, planShape));
  }
  for (const SafetensorsEntry& entry : file.entries())
    if (!known.count(entry.name)) problems.push_back(weightsFile + ": unexpected key " + entry.name);
  throwIfProblems(directory, problems);
  return tensors;
}

std::map<std::string, HostTensor> peftMergeDeltas(const std::string& directory) {
  const AdapterSettings settings = readPeftAdapterSettings(directory);
  const double scale = settings.alpha / static_cast<double>(settings.rank);
  const std::string weightsFile = (fs::path(directory) / kPeftWeightsFileName).string();
  if (!fs::exists(weightsFile)) throw InputError(weightsFile + ": missing (expected a PEFT adapter directory)");
  const SafetensorsFile file = SafetensorsFile::open(weightsFile);
  const std::string decoderPrefix = std::string(kPeftPrefix) + std::string(kDecoderPrefix);
  const std::string encoderPrefix = std::string(kPeftPrefix) + std::string(kEncoderTextPrefix);

  std::vector<std::string> problems;
  std::map<std::string, HostTensor> deltas;
  auto readFloat = [&](const std::string& key) -> std::optional<HostTensor> {
    const SafetensorsEntry* entry = file.find(key);
    if (!entry) {
      problems.push_back(weightsFile + ": missing key " + key);
      return std::nullopt;
    }
    if (!isFloating(entry->dtype) || entry->shape.size() != 2) {
      problems.push_back(weightsFile + ": key " + key + ": expected a 2-D float tensor, found " +
                         std::string(dtypeName(entry->dtype)) + " " + shapeToString(entry->shape));
      return std::nullopt;
    }
    return convertDType(file.read(key), DType::F64, weightsFile + ": key " + key);
  };
  for (const SafetensorsEntry& entry : file.entries()) {
    const std::string& key = entry.name;
    const bool decoder = startsWith(key, decoderPrefix), encoder = startsWith(key, encoderPrefix);
    if ((!decoder && !encoder) || !(endsWith(key, kLinearA) || endsWith(key, kLinearB))) {
      problems.push_back(weightsFile + ": unexpected key " + key +
                         " (expected base_model.model.model.decoder.* / model.encoder.language_model.* LoRA factors)");
      continue;
    }
    // Each pair is merged from its decoder keys; an encoder key must be the same tensor (tied weights).
    if (encoder) {
      const std::string twin = decoderPrefix + key.substr(encoderPrefix.size());
      const SafetensorsEntry* decoderEntry = file.find(twin);
      if (!decoderEntry) problems.push_back(weightsFile + ": key " + key + " has no decoder twin " + twin);
      else if (decoderEntry->dtype != entry.dtype || decoderEntry->shape != entry.shape ||
               std::memcmp(file.data(*decoderEntry), file.data(entry), entry.bytes) != 0)
        problems.push_back(weightsFile + ": key " + key + " differs from " + twin +
                           " (dgemma applies one adapter to the tied encoder and decoder weights)");
      continue;
    }
    if (!file.find(encoderPrefix + key.substr(decoderPrefix.size())))
      problems.push_back(weightsFile + ": missing key " + encoderPrefix + key.substr(decoderPrefix.size()) +
                         " (the encoder's copy of " + key + ")");
    if (!endsWith(key, kLinearA)) continue;
    const std::string module = key.substr(kPeftPrefix.size(), key.size() - kPeftPrefix.size() - kLinearA.size());
    const std::optional<HostTensor> a = readFloat(key);
    const std::optional<HostTensor> b = readFloat(std::string(kPeftPrefix) + module + std::string(kLinearB));
    if (!a || !b) continue;
    const int64_t rank = settings.rank;
    std::string weight;
    bool expert = false;
    if (endsWith(module, ".experts.base_layer")) {
      weight = module.substr(0, module.size() - std::strlen(".base_layer")) + ".gate_up_proj";
      expert = true;
    } else if (endsWith(module, ".experts")) {
      const bool gateUp = targets(settings, kGateUpTarget), down = targets(settings, kDownTarget);
      weight = module + (down ? ".down_proj" : gateUp ? ".gate_up_proj" : "");
      expert = true;
      if (!gateUp && !down) {
        problems.push_back(weightsFile + ": key " + key +
                           ": an experts adapter, but target_parameters names no expert tensor");
        continue;
      }
    } else {
      weight = module + ".weight";
    }
    const int64_t rowsA = a->shape[0], in = a->shape[1], out = b->shape[0], columnsB = b->shape[1];
    const int64_t experts = expert ? rowsA / rank : 1;
    if (rowsA != experts * rank || columnsB != experts * rank) {
      problems.push_back(weightsFile + ": key " + key + ": shapes " + shapeToString(a->shape) + " and " +
                         shapeToString(b->shape) + " do not fit rank " + std::to_string(rank));
      continue;
    }
    HostTensor delta(DType::F64, expert ? std::vector<int64_t>{experts, out, in} : std::vector<int64_t>{out, in});
    const double *factorA = a->as<double>(), *factorB = b->as<double>();
    double* to = delta.as<double>();
    for (int64_t e = 0; e < experts; ++e)
      for (int64_t o = 0; o < out; ++o)
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0.0;
          for (int64_t k = 0; k < rank; ++k)
            sum += factorB[o * columnsB + k * experts + e] * factorA[(e * rank + k) * in + i];
          to[(e * out + o) * in + i] = scale * sum;
        }
    deltas.emplace(weight, std::move(delta));
  }
  throwIfProblems(directory, problems);
  return deltas;
}

}  // namespace dgemma
