// The text weights of DiffusionGemma by their HF state-dict names (docs/model.md, "Text tensors"), and the
// loader rules that map a checkpoint's tensors onto them (docs/model.md, "Checkpoint loading rules"). dgemma keeps one copy of the text
// stack under the decoder's names: the encoder's language_model is the same tensors (docs/model.md, "Tying").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "models/diffusion_gemma/spec/Config.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {

// The canonical prefix of every text tensor, and the prefix of the encoder's tied copy.
inline constexpr std::string_view kDecoderPrefix = "model.decoder.";
inline constexpr std::string_view kEncoderTextPrefix = "model.encoder.language_model.";
// Vision tensors live under these (expectedVisionWeights); only image plans declare them.
inline constexpr std::string_view kVisionTowerPrefix = "model.encoder.vision_tower.";
inline constexpr std::string_view kVisionEmbedderPrefix = "model.encoder.embed_vision.";
// Absent from the release; when present it must equal the embedding, which stands in for it.
inline constexpr std::string_view kLmHeadName = "lm_head.weight";

struct ExpectedTensor {
  std::string name;  // canonical: model.decoder.…
  std::vector<int64_t> shape;
  // layer_scalar is a persistent buffer, not a parameter: it is loaded but never trained.
  bool isBuffer = false;
};

// Every text tensor of the model in a fixed order: per layer (0..L-1) in the row order of
// docs/model.md, "Text tensors", then the embedding, the final norm and the four self-conditioning tensors.
std::vector<ExpectedTensor> expectedTextWeights(const DiffusionGemmaConfig& config);

// Every vision tensor of a config with a vision_config (docs/model.md, "Vision tensors"): per
// vision layer the attention, norm and MLP weights, then the patch projection, the position tables,
// std_bias and std_scale (buffers, when standardize) and the projector into the text width. Empty
// without a vision_config.
std::vector<ExpectedTensor> expectedVisionWeights(const DiffusionGemmaConfig& config);

// How tensor and expert parallelism split a text tensor (docs/parallelism.md, "Tensor-parallel
// mapping"), by its canonical name: "vocab" (the embedding: rows over TP), "column" (q/k/v and the
// dense gate/up: dim 0 over TP), "row" (o_proj and the dense down: dim 1 over TP), "experts" (dim 0
// over EP) or "replicated" (norms, router, layer_scalar, self-conditioning).
std::string_view tensorParallelRole(std::string_view name);

struct ResolvedCheckpoint {
  // Canonical name -> the checkpoint tensor to read for it (under either prefix). Valid while the
  // SafetensorsDirectory lives.
  std::map<std::string, SafetensorsLocation> textTensors;
  // Checkpoint names under the vision prefixes, sorted.
  std::vector<std::string> visionTensorNames;
  // With a vision_config: canonical vision name -> its checkpoint tensor, for those the checkpoint
  // holds (an image plan's loader reports the missing ones; a text-only plan reads none).
  std::map<std::string, SafetensorsLocation> visionTensors;
};

// Applies the loader rules of docs/model.md, "Checkpoint loading rules" to `checkpoint`:
//  - a text tensor may be stored under model.decoder. or model.encoder.language_model. (the
//    self-conditioning block only under model.decoder.); when both copies exist they must be
//    bit-identical (same dtype, same bytes). This also covers layer_scalar, the one text tensor HF
//    stores twice because buffers are not tied;
//  - lm_head.weight is optional and, when present, must be bit-identical to the embedding;
//  - text tensors must have a floating dtype and the shape of expectedTextWeights;
//  - anything else that is not a vision tensor (including v_proj on a full-attention layer) is
//    unexpected;
//  - with a vision_config, a tensor under the vision prefixes must be one of expectedVisionWeights,
//    with its shape and a floating dtype.
// Every missing, unexpected, mis-shaped or mismatched tensor goes into one InputError
// "PATH: N problem(s) with the text weights:" with one line per problem. When `needed` is given, a
// text tensor it answers false for may be missing: a plan that never reads it (a pre-training plan
// has no self-conditioning block, so neither have its checkpoints; docs/pretraining.md, "Sampling").
ResolvedCheckpoint resolveCheckpointNames(const DiffusionGemmaConfig& config, const SafetensorsDirectory& checkpoint,
                                          const std::function<bool(const std::string&)>& needed = {});

}  // namespace dgemma
