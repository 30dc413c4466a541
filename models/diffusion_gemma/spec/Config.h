// The DiffusionGemma configuration as dgemma builds it: the HF config.json after every
// post-processing rule HF applies when it loads one (docs/model.md, "Config loading rules"), resolved
// into one geometry record per layer, so that the builder and the weight schema never have to know
// which of the HF spellings (per_layer_config or global_head_dim, explicit or default
// rope_parameters, explicit or derived layer_types) the file used.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/DType.h"

namespace dgemma {

enum class AttentionLayerType { Sliding, Full };

// "default": every pair of the head rotates, exponent denominator head_dim.
// "proportional": the first floor(partial_rotary_factor * head_dim / 2) pairs rotate, still with
// exponent denominator head_dim; the remaining pairs have frequency 0 (docs/model.md, "Rotary embedding").
enum class RopeType { Default, Proportional };

struct RopeParameters {
  RopeType type = RopeType::Default;
  double theta = 10000.0;
  double partialRotaryFactor = 1.0;  // always 1 for RopeType::Default
};

struct LayerGeometry {
  AttentionLayerType type = AttentionLayerType::Sliding;
  int64_t headDim = 0;
  int64_t numQueryHeads = 0;
  int64_t numKeyValueHeads = 0;
  RopeParameters rope;
};

// The Gemma 4 vision tower (docs/model.md, "Vision config"): HF's Gemma4VisionConfig with its class
// defaults for absent fields. Only what dgemma builds is representable: no clipped linears, the
// gelu_pytorch_tanh MLP, 2-D RoPE over head halves (so head_dim is a multiple of 4).
struct VisionConfig {
  int64_t hiddenSize = 768;
  int64_t intermediateSize = 3072;
  int64_t numHiddenLayers = 16;
  int64_t numAttentionHeads = 12;
  int64_t numKeyValueHeads = 12;
  int64_t headDim = 64;
  double rmsNormEps = 1e-6;
  double ropeTheta = 100.0;  // each head half rotates with f_i = theta^(-2i / (head_dim / 2))
  int64_t patchSize = 16;
  int64_t poolingKernelSize = 3;
  int64_t positionEmbeddingSize = 10240;  // rows of each of the two position tables (x and y)
  bool standardize = false;               // std_bias / std_scale after pooling

  int64_t patchDim() const { return 3 * patchSize * patchSize; }  // D_p: RGB values of one patch
};

struct DiffusionGemmaConfig {
  // Text stack (docs/model.md, "Text config"), shared by encoder and decoder.
  int64_t vocabSize = 0;
  // Rows of the embedding table (and columns of the tied head) in a compiled plan: vocabSize rounded up
  // to a multiple of lcm(TP, --vocab-alignment). Not an HF field: the parser sets it to vocabSize and
  // the compiler pads it (docs/parallelism.md, "Vocabulary padding").
  int64_t paddedVocabSize = 0;
  int64_t hiddenSize = 0;
  int64_t intermediateSize = 0;  // dense MLP and self-conditioning MLP
  int64_t numHiddenLayers = 0;
  int64_t numExperts = 0;
  int64_t topKExperts = 0;
  int64_t moeIntermediateSize = 0;
  int64_t slidingWindow = 0;
  int64_t maxPositionEmbeddings = 0;
  double rmsNormEps = 0.0;
  double finalLogitSoftcapping = 0.0;
  // The std of the normal init of every weight `--init random` draws from a normal (HF's
  // _init_weights reads the same field); it does not change a loaded checkpoint.
  double initializerRange = 0.02;
  // use_bidirectional_attention == "vision": image tokens attend bidirectionally inside their image
  // in the encoder. false means null (everything causal); "all" is rejected.
  bool imageTokensBidirectional = false;
  int64_t padTokenId = 0;
  int64_t bosTokenId = 0;
  std::vector<int64_t> eosTokenIds;   // the top-level list when the file has one, else the text config's
  // The absorbing token of masked-diffusion pre-training (docs/pretraining.md, "Objectives"), when the
  // text config names one (mask_token_id).
  std::optional<int64_t> maskTokenId;
  std::vector<LayerGeometry> layers;  // numHiddenLayers entries

  // Top level (docs/model.md, "Top-level config"). A bare text config gets HF's top-level defaults.
  int64_t canvasLength = 0;
  int64_t boiTokenId = 0;
  int64_t eoiTokenId = 0;
  int64_t imageTokenId = 0;
  // Ties the LM head to the embedding and the encoder text stack to the decoder's. The loader
  // rejects false: the weight schema and the loader rules (docs/model.md, "Checkpoint loading rules") exist only for tied weights.
  bool tieWordEmbeddings = true;
  bool hasVision = false;  // a non-null vision_config, parsed into `vision`
  VisionConfig vision;     // meaningful only when hasVision
  // vision_soft_tokens_per_image: T, the pooled tokens an image may give at most (the processor's
  // budget and the pooler's output slots per image).
  int64_t maxSoftTokensPerImage = 280;

  // Fields the loader ignored and rules it applied that change what the file says, one line each,
  // "PATH: FIELD: what happened". The caller decides whether to print them.
  std::vector<std::string> warnings;

  const LayerGeometry& layer(int64_t layerIndex) const;
  bool isFullAttention(int64_t layerIndex) const { return layer(layerIndex).type == AttentionLayerType::Full; }
  // Full layers have no v_proj: V is the weightless RMS norm of the raw K projection.
  bool hasValueProjection(int64_t layerIndex) const { return !isFullAttention(layerIndex); }
  int64_t queryWidth(int64_t layerIndex) const;     // q heads * head_dim: q_proj rows, o_proj columns
  int64_t keyValueWidth(int64_t layerIndex) const;  // KV heads * head_dim: k_proj (and v_proj) rows
  int64_t queryHeadsPerKeyValueHead(int64_t layerIndex) const;
  // Pairs (i, i + head_dim/2) that rotate; the others pass through with angle 0.
  int64_t ropeRotatedPairs(int64_t layerIndex) const;
  // √hidden_size rounded to the embedding dtype, as HF keeps it: 53.0 in bf16 for H = 2816.
  double embeddingScale(DType embeddingDType) const;
  // N_p = T·k²: the patches an image is padded to (the processor's max_patches).
  int64_t imagePatches() const { return maxSoftTokensPerImage * vision.poolingKernelSize * vision.poolingKernelSize; }
};

// Reads `pathToConfigJsonOrDir` (a config.json, or a directory holding one) and applies HF's
// post-processing. Accepts the top-level DiffusionGemmaConfig (model_type "diffusion_gemma", with a
// text_config) and a bare text config (model_type "diffusion_gemma_text", or no model_type and no
// text_config). Rejects, with an InputError "PATH: FIELD: expected ..., got ...", every config dgemma
// cannot honour.
DiffusionGemmaConfig loadDiffusionGemmaConfig(const std::string& pathToConfigJsonOrDir);

// The same for a config already parsed (e.g. the copy a plan carries in its metadata); `source`
// names it in messages.
DiffusionGemmaConfig parseDiffusionGemmaConfig(const nlohmann::json& root, const std::string& source);

// The text of a config.json, parsed with the nesting bound of support/Json.h and then as above:
// every way the text can be wrong is an InputError naming `source` (the fuzz target's entry).
DiffusionGemmaConfig parseDiffusionGemmaConfigText(std::string_view text, const std::string& source);

}  // namespace dgemma
