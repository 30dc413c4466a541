// What one dgemma-compile run is asked for (docs/cli.md): every value its flags set, and what
// follows from those values alone. The tool fills the struct; the driver (Driver.h) validates it
// against the model and compiles.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "compiler/Pipeline/Pipeline.h"
#include "plan/OptimizerSettings.h"

namespace dgemma {

// The ranges of the numeric options (docs/cli.md, "Flag ranges"): far beyond any real run, and
// small enough that the sizes built from them cannot overflow.
constexpr int64_t kMaxMicroBatch = 65536;
constexpr int64_t kMaxLength = int64_t{1} << 20;  // --prompt-len, --canvas-len, --max-new-tokens
constexpr int64_t kMaxBuiltinSize = 65536;        // --hidden-size, --vocab-size of the built-in graph
constexpr int64_t kMaxParallel = 1024;            // --tp, --ep, --dp
constexpr int64_t kMaxVocabAlignment = 65536;     // --vocab-alignment
constexpr int64_t kMaxImagesPerExample = 1024;
constexpr int64_t kMaxLoraRank = 65536;
constexpr double kMaxWeight = 1e6;                // loss weights, coefficients, clips, weight decay
constexpr double kMaxGradNorm = 1e30;
// Tokens of one global micro-batch (micro-batch x DP x (longest prompt + canvas + cache)): the
// builder lays out position tables of this many entries before any size is checked.
constexpr int64_t kMaxTokensPerMicroBatch = int64_t{1} << 24;

// Each member is the flag it is named after (docs/cli.md); the defaults are the flags'.
struct CompileOptions {
  std::string model;
  std::string mode;
  std::string preset;
  std::string objective = "base-sft";  // or a pre-training objective: autoregressive | masked-diffusion
  // Pre-training (docs/pretraining.md, "Objectives"): --seq-len's buckets, the masked-diffusion
  // --mask-token-id (unset: the config's mask_token_id) and --mask-epsilon (unset: 1e-3).
  std::string sequenceLengths;
  std::optional<int64_t> maskTokenId;
  std::optional<double> maskEpsilon;
  // The flags given on the command line that only one family of objectives reads (the SFT and GRPO
  // ones, or the pre-training ones), so that checkObjectiveFlags can refuse the others' flags.
  std::vector<std::string> explicitObjectiveFlags;
  double selfCondProb = 0.5;  // docs/training.md, "Self-conditioning": dgemma's default training config (the MB recipe)
  std::optional<double> encoderLossWeight;  // unset: encoderLossWeight(options) chooses
  double decoderLossWeight = 1.0;
  std::optional<double> weightClip;
  double auxLossCoeff = 0.0;
  double noiseMin = 1e-3, noiseMax = 1.0 - 1e-3;
  // --policy-loss none | grpo, and GRPO's --clip-epsilon, --clip-delta and --kl-coeff
  // (docs/rl.md); unset: policyLossSettings chooses.
  std::string policyLoss = "none";
  std::optional<double> clipEpsilon, clipDelta, klCoeff;
  OptimizerSettings adam;
  int64_t microBatch = 2;
  int64_t imagesPerExample = 0;  // --images-per-example: 0 = a text-only plan (docs/cli.md)
  std::string promptLengths = "8";
  int64_t canvasLength = 0;  // 0: the model config's canvas_length
  std::optional<int64_t> maxNewTokens;  // unset: generation_config.json's max_new_tokens, else 256
  int64_t hiddenSize = 64;
  int64_t vocabSize = 128;
  int64_t tp = 1, ep = 1, dp = 1;
  // The embedding is padded to a multiple of lcm(tp, vocabAlignment) rows (docs/parallelism.md, "Vocabulary padding").
  int64_t vocabAlignment = 1;
  int64_t cp = 1;  // --cp: context parallelism (docs/parallelism.md, "Context parallelism")
  bool sequenceParallel = false;
  bool distributedOptimizer = true;
  std::string expertExchange = "all-gather";  // all-gather | all-to-all
  // --optimizer-offload: whose AdamW moments live in host memory and are updated there (docs/parallelism.md,
  // "Optimizer-state offload").
  std::string optimizerOffload = "none";  // none | experts | all
  std::string recompute = "none";
  std::string backwardOrder = "scheduled";  // scheduled (dg-backward-schedule) | autodiff
  std::string fusion = "on";  // dg-fuse-elementwise
  std::string baseDtype = "f32";  // --base-dtype: f32 (unchanged) | bf16 | int8 | nf4 (dg-base-dtype)
  std::string precision = "fp32";
  // --lora RANK[:ALPHA] (empty: no adapters), --lora-targets, --lora-dropout (docs/training.md, "LoRA adapters").
  std::string lora;
  std::string loraTargets = "attention,mlp";
  double loraDropout = 0;
  std::string backend = "cpu";
  std::string emit;
  bool report = false;
  std::string output;
  // --auto-layout (docs/parallelism.md, "Layout search"): the layout and recompute policy are searched.
  bool autoLayout = false;
  int64_t gpus = 0;  // 0: not given
  std::string gpuMemory;
  std::string gpu;  // empty: h200
  std::vector<std::string> explicitLayoutFlags;  // the layout flags given on the command line
};

// The name --model takes for the built-in graph (the other form is an HF config).
std::string builtinModelName();
// The compile flags preset `name` sets (without the leading --), each value as command-line text;
// throws InputError for an unknown preset.
std::vector<std::pair<std::string, std::string>> presetCompileFlags(const std::string& name);

// --prompt-len's buckets, sorted and without repeats.
std::vector<int64_t> parsePromptLengths(const std::string& text);
// --seq-len's buckets, sorted and without repeats.
std::vector<int64_t> parseSequenceLengths(const std::string& text);
// Whether --objective names a pre-training objective (autoregressive, masked-diffusion, block-diffusion).
bool isPretrainingObjective(const CompileOptions& options);
// Throws InputError naming the flag when a flag given on the command line does not apply to the
// --objective: the SFT, GRPO and image flags with a pre-training objective (block-diffusion takes
// --canvas-len, --noise-min and --noise-max), --seq-len without one, --mask-token-id /
// --mask-epsilon without masked-diffusion, and --mask-epsilon with --mode infer.
void checkObjectiveFlags(const CompileOptions& options);
// The flags checkObjectiveFlags judges: those that only the SFT/GRPO objectives read, and those that
// only the pre-training objectives read.
const std::vector<std::string>& sftObjectiveFlags();
const std::vector<std::string>& pretrainingObjectiveFlags();
bool isMultiRank(const CompileOptions& options);
mlir::dg::ShardingOptions shardingOptions(const CompileOptions& options);
// Options whose features later work adds are rejected now rather than silently ignored.
void rejectUnbuiltFeatures(const CompileOptions& options);
// --lora's adapters (rank, alpha; ALPHA defaults to RANK), targets and dropout; nullopt without --lora.
// Throws InputError naming the flag when the text is malformed or out of range.
std::optional<mlir::dg::LoraOptions> loraOptions(const CompileOptions& options);
// The encoder loss weight: --encoder-loss-weight, else 1 for SFT and 0 for --policy-loss grpo.
// Throws InputError for a nonzero weight with grpo (the encoder loss trains on completions as
// targets: SFT, not RL; docs/rl.md).
double encoderLossWeight(const CompileOptions& options);
struct PolicyLossSettings {
  double clipEpsilon = 0.2;
  std::optional<double> clipDelta;  // the two-sided clip's bound on the ratio of a negative advantage
  double klCoeff = 0.0;
};
// GRPO's clip epsilon, two-sided clip bound and KL coefficient (defaults 0.2, none and 0); throws
// InputError when one is given without --policy-loss grpo, or when the bound is not above 1 + ε.
PolicyLossSettings policyLossSettings(const CompileOptions& options);
// The config.json --model names (an HF checkpoint directory or the file itself).
std::filesystem::path diffusionGemmaConfigPath(const CompileOptions& options);

}  // namespace dgemma
