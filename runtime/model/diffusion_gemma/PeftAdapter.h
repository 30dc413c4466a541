// DiffusionGemma's LoRA adapters in PEFT's format (docs/training.md, "LoRA adapters" and its "PEFT
// format"): a directory with adapter_config.json and adapter_model.safetensors that
// PeftModel.from_pretrained loads onto transformers' DiffusionGemma model. The plan names an
// adapter by the decoder's weights (model.decoder.*); transformers' encoder text stack is a second
// module over the same tied weights, so PEFT wraps both and the file carries every adapter twice,
// under the decoder's and the encoder's module path, with the same values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "plan/Plan.h"
#include "runtime/core/HostTensor.h"

namespace dgemma {

inline constexpr const char* kPeftConfigFileName = "adapter_config.json";
inline constexpr const char* kPeftWeightsFileName = "adapter_model.safetensors";
// The PEFT release whose format this module writes and reads.
inline constexpr const char* kPeftFormatVersion = "0.21.2";

// Whether `name` is a plan's LoRA parameter: `P.lora_A.weight` / `P.lora_B.weight` of a linear
// weight `P.weight` under model.decoder., or `...experts.gate_up_proj.lora_A` (and _B, and
// down_proj's) of the routed experts; not the gradient buffer or optimizer state named after one.
bool isLoraParameterName(const std::string& name);

// How a plan adapter tensor sits in PEFT's file.
enum class PeftLayout {
  Linear,   // the same [r, in] / [out, r]
  ExpertA,  // plan [E, r, in] <-> PEFT [E*r, in] (expert-major rows)
  ExpertB,  // plan [E, out, r] <-> PEFT [out, r*E] (column k*E + e holds expert e's column k)
};

struct PeftKeys {
  std::string decoderKey;  // base_model.model.model.decoder....
  std::string encoderKey;  // base_model.model.model.encoder.language_model.... (the tied copy)
  PeftLayout layout = PeftLayout::Linear;
};

// The PEFT keys of plan adapter parameter `planName` under `settings` (which expert tensors are
// targeted decides PEFT's nesting of the experts' wrappers). InputError when it is no adapter name.
PeftKeys peftKeysOf(const std::string& planName, const AdapterSettings& settings);

// A plan tensor in PEFT's layout and back (`planShape`: the plan's global shape).
HostTensor toPeftLayout(const HostTensor& planTensor, PeftLayout layout);
HostTensor fromPeftLayout(const HostTensor& peftTensor, PeftLayout layout, const std::vector<int64_t>& planShape);
std::vector<int64_t> peftShapeOf(const std::vector<int64_t>& planShape, PeftLayout layout);

// target_modules: a regular expression (PEFT full-matches it against every module name) that
// matches exactly the linear modules of `settings.targets` in the encoder's and the decoder's text
// layers; null when only expert tensors are targeted.
nlohmann::json peftTargetModules(const AdapterSettings& settings);

// adapter_config.json's contents for `settings`; `baseModel` is base_model_name_or_path.
nlohmann::ordered_json peftAdapterConfig(const AdapterSettings& settings, const std::string& baseModel);

// The two files of an adapter directory, as (file name, bytes): `tensors` maps every adapter
// parameter of the plan to its global tensor (any float dtype; written as f32).
std::vector<std::pair<std::string, std::string>> peftAdapterFiles(const AdapterSettings& settings,
                                                                  const std::string& baseModel,
                                                                  const std::map<std::string, HostTensor>& tensors);

// Writes them into `directory` (created if missing), each file atomically (temporary name, fsync,
// rename), the config last.
void writePeftAdapterDirectory(const std::string& directory, const AdapterSettings& settings,
                               const std::string& baseModel, const std::map<std::string, HostTensor>& tensors);

// Checks `directory`'s adapter_config.json against `settings` (peft_type, r, lora_alpha, the
// targets, no rank or alpha patterns, no rsLoRA/DoRA) and reads adapter_model.safetensors: for every
// plan adapter parameter of `expected` (name -> global shape) its f32 tensor in the plan's layout.
// Every problem (missing, unexpected or mis-shaped key, encoder and decoder copies that differ) is
// collected into one InputError naming the file and the key or field.
std::map<std::string, HostTensor> readPeftAdapterDirectory(const std::string& directory,
                                                           const AdapterSettings& settings,
                                                           const std::map<std::string, std::vector<int64_t>>& expected);

// The LoRA settings an adapter directory's config describes (rank, alpha, dropout, targets), for a
// merge that has no plan; InputError naming the file and field it cannot read.
AdapterSettings readPeftAdapterSettings(const std::string& directory);

// ΔW = (alpha/r)·B·A of every base weight `directory`'s adapter changes, by the canonical
// (model.decoder.*) name of that weight, in f64; experts per expert ([E, out, in]). The encoder copies
// in the file must equal the decoder's (checked), and each tied weight gets its ΔW once.
std::map<std::string, HostTensor> peftMergeDeltas(const std::string& directory);

}  // namespace dgemma
