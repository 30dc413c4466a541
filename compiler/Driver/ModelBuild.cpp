#include "compiler/Driver/ModelBuild.h"

#include <filesystem>
#include <iostream>

#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgOps.h"
#include "models/builtin/RmsNormMatmulSoftmax.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/ir/Inference.h"
#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/GenerationConfig.h"
#include "models/diffusion_gemma/spec/Interface.h"
#include "models/diffusion_gemma/spec/ParallelLayout.h"
#include "support/AtomicFile.h"
#include "support/CheckedSize.h"
#include "support/Error.h"
#include "support/Shape.h"

namespace dgemma {

namespace {

ParallelLayout parallelLayout(const CompileOptions& options) {
  return ParallelLayout{options.tp, options.dp, options.ep, options.sequenceParallel, options.cp};
}

// What context parallelism splits (docs/parallelism.md, "Context parallelism"): the SFT training
// step's causal encoder passes over text. Throws InputError naming --cp for anything else.
void checkContextParallelScope(const CompileOptions& options) {
  if (options.cp == 1) return;
  const std::string flag = "--cp " + std::to_string(options.cp);
  if (options.mode != "train")
    throw InputError(flag + ": context parallelism splits the training step's encoder passes; --mode " + options.mode +
                     " is not split (compile it without --cp)");
  if (isPretrainingObjective(options))
    throw InputError(flag + ": --objective " + options.objective +
                     " is not split over context ranks (only the SFT objective's encoder passes are)");
}

void checkVocabAlignment(int64_t alignment) {
  if (alignment < 1 || alignment > kMaxVocabAlignment)
    throw InputError("--vocab-alignment " + std::to_string(alignment) + ": expected an integer in [1, " +
                     std::to_string(kMaxVocabAlignment) + "] (the vocabulary is padded to a multiple of lcm(--tp, N))");
}

// The objective flags (docs/training.md, "The objective"), validated.
mlir::dg::DiffusionGemmaObjective trainingObjective(const CompileOptions& options) {
  mlir::dg::DiffusionGemmaObjective objective;
  objective.variant = *mlir::dg::parseObjectiveVariant(options.objective);  // CLI11 checked the name
  // Each flag's own range is checked as it is parsed (docs/cli.md, "Flag ranges"); here only how they relate.
  if (!(options.noiseMin <= options.noiseMax))
    throw InputError("--noise-min/--noise-max: expected 0 <= noise_min <= noise_max <= 1");
  objective.selfConditioningProb = options.selfCondProb;
  objective.encoderLossWeight = encoderLossWeight(options);
  objective.decoderLossWeight = options.decoderLossWeight;
  objective.routerAuxLossCoeff = options.auxLossCoeff;
  objective.weightClip = options.weightClip;
  objective.noiseMin = options.noiseMin;
  objective.noiseMax = options.noiseMax;
  const PolicyLossSettings policy = policyLossSettings(options);
  if (options.policyLoss == "grpo") {
    objective.policyLoss = mlir::dg::DiffusionGemmaObjective::PolicyLoss::Grpo;
    objective.clipEpsilon = policy.clipEpsilon;
    objective.clipDelta = policy.clipDelta;
    objective.klCoeff = policy.klCoeff;
  }
  const bool reweighted = objective.variant == mlir::dg::DiffusionGemmaObjective::Variant::ReweightedCe ||
                          objective.variant == mlir::dg::DiffusionGemmaObjective::Variant::ReweightedLooCe;
  if (reweighted && !objective.weightClip)
    std::cerr << "dgemma-compile: warning: --objective " << options.objective
              << " without --weight-clip: the weight 1/(1-t) reaches " << 1.0 / std::max(1.0 - options.noiseMax, 1e-12)
              << " at t = noise_max (docs/training.md, 'The four objectives', suggests a clip of 100)\n";
  return objective;
}

// The pre-training objective flags (docs/pretraining.md, "Objectives"), validated against the config.
mlir::dg::DiffusionGemmaPretrainingObjective pretrainingObjective(const CompileOptions& options,
                                                                  const DiffusionGemmaConfig& config,
                                                                  const std::string& configPath) {
  using Kind = mlir::dg::DiffusionGemmaPretrainingObjective::Kind;
  mlir::dg::DiffusionGemmaPretrainingObjective objective;
  objective.kind = *mlir::dg::parsePretrainingObjective(options.objective);  // checkObjectiveFlags checked it
  objective.routerAuxLossCoeff = options.auxLossCoeff;
  if (objective.kind == Kind::MaskedDiffusion) {
    if (!options.maskTokenId && !config.maskTokenId)
      throw InputError("--objective masked-diffusion: needs --mask-token-id (" + configPath +
                       " names no mask_token_id)");
    objective.maskTokenId = options.maskTokenId.value_or(config.maskTokenId.value_or(0));
    if (objective.maskTokenId >= config.vocabSize)
      throw InputError("--mask-token-id " + std::to_string(objective.maskTokenId) + ": outside the vocabulary [0, " +
                       std::to_string(config.vocabSize) + ") of " + configPath);
    objective.maskEpsilon = options.maskEpsilon.value_or(1e-3);
  }
  if (objective.kind == Kind::BlockDiffusion) {
    objective.canvasLength = options.canvasLength != 0 ? options.canvasLength : config.canvasLength;
    if (options.noiseMin > options.noiseMax)
      throw InputError("--noise-min/--noise-max: expected 0 <= noise_min <= noise_max <= 1");
    objective.noiseMin = options.noiseMin;
    objective.noiseMax = options.noiseMax;
    for (int64_t sequenceLength : parseSequenceLengths(options.sequenceLengths))
      if (sequenceLength % objective.canvasLength != 0)
        throw InputError("--seq-len " + std::to_string(sequenceLength) + ": expected a multiple of the canvas length " +
                         std::to_string(objective.canvasLength) +
                         (options.canvasLength != 0 ? " (--canvas-len)" : " (" + configPath + " canvas_length)") +
                         ": block diffusion cuts each packed row into whole blocks");
  }
  return objective;
}

// An inference plan's (`train` false) records the mask token its sampler fills masked positions
// with (docs/pretraining.md, "Sampling"), and no training-only setting.
nlohmann::json pretrainingMetadata(const mlir::dg::DiffusionGemmaPretrainingObjective& objective, bool train) {
  nlohmann::json metadata = {{"variant", mlir::dg::pretrainingObjectiveName(objective.kind)}};
  if (train) metadata["router_aux_loss_coeff"] = objective.routerAuxLossCoeff;
  if (objective.kind == mlir::dg::DiffusionGemmaPretrainingObjective::Kind::MaskedDiffusion) {
    metadata["mask_token_id"] = objective.maskTokenId;
    if (train) metadata["mask_epsilon"] = objective.maskEpsilon;
  }
  if (objective.kind == mlir::dg::DiffusionGemmaPretrainingObjective::Kind::BlockDiffusion) {
    metadata["canvas_length"] = objective.canvasLength;
    metadata["noise_min"] = objective.noiseMin;
    metadata["noise_max"] = objective.noiseMax;
  }
  return metadata;
}

nlohmann::json objectiveMetadata(const mlir::dg::DiffusionGemmaObjective& objective) {
  nlohmann::json metadata = {
      {"variant", mlir::dg::objectiveVariantName(objective.variant)},
      {"weight_clip", objective.weightClip ? nlohmann::json(*objective.weightClip) : nlohmann::json(nullptr)},
      {"self_conditioning_prob", objective.selfConditioningProb},
      {"decoder_loss_weight", objective.decoderLossWeight},
      {"encoder_loss_weight", objective.encoderLossWeight},
      {"router_aux_loss_coeff", objective.routerAuxLossCoeff},
      {"noise_min", objective.noiseMin},
      {"noise_max", objective.noiseMax}};
  // An SFT plan's metadata stays as it was before GRPO existed.
  if (objective.policyLoss == mlir::dg::DiffusionGemmaObjective::PolicyLoss::Grpo) {
    metadata["policy_loss"] = "grpo";
    metadata["clip_epsilon"] = objective.clipEpsilon;
    if (objective.clipDelta) metadata["clip_delta"] = *objective.clipDelta;
    metadata["kl_coeff"] = objective.klCoeff;
  }
  return metadata;
}

// The generation settings of an inference plan (docs/inference-plan.md): the model's
// generation_config.json (beside --model) over HF's defaults; --max-new-tokens sizes the cache.
GenerationSettings generationSettings(const CompileOptions& options, const DiffusionGemmaConfig& config,
                                      int64_t maxPromptLength) {
  const DiffusionGemmaGenerationConfig file =
      loadGenerationConfigBeside(options.model).value_or(DiffusionGemmaGenerationConfig{});
  checkGenerationTokenIds(file, config.vocabSize);
  GenerationSettings settings;
  settings.canvasLength = config.canvasLength;
  settings.maxNewTokens = options.maxNewTokens.value_or(file.maxNewTokens);
  if (settings.maxNewTokens < 1) throw InputError("--max-new-tokens: expected a positive integer");
  settings.cacheLength = mlir::dg::inferenceCacheLength(maxPromptLength, settings.maxNewTokens, config.canvasLength);
  settings.maxDenoisingSteps = file.maxDenoisingSteps;
  settings.entropyBound = file.entropyBound;
  settings.tMin = file.tMin;
  settings.tMax = file.tMax;
  settings.stabilityThreshold = file.stabilityThreshold;
  settings.confidenceThreshold = file.confidenceThreshold;
  settings.eosTokenIds = file.eosTokenIds.value_or(config.eosTokenIds);
  settings.padTokenId = file.padTokenId.value_or(config.padTokenId);
  return settings;
}

// The builder lays out position tables per token while it builds, so the token count of one
// global micro-batch is bounded before anything is built.
// `perExample` says what the tokens of one example are, for the message.
void checkTokensPerMicroBatch(int64_t globalMicroBatch, int64_t tokensPerExample, const std::string& perExample,
                              const CompileOptions& options) {
  const std::optional<int64_t> tokens = checkedMultiply(globalMicroBatch, tokensPerExample);
  if (!tokens || *tokens > kMaxTokensPerMicroBatch)
    throw InputError("--micro-batch " + std::to_string(options.microBatch) +
                     (options.dp > 1 ? " x --dp " + std::to_string(options.dp) : "") + " with " +
                     std::to_string(tokensPerExample) + " tokens per example (" + perExample + "): more than " +
                     std::to_string(kMaxTokensPerMicroBatch) + " tokens per micro-batch");
}

}  // namespace

void RuntimeFields::copyInto(Plan& plan) const {
  plan.modelFamily = family;
  plan.modelConfig = modelConfig;
  plan.modelGenerationConfig = modelGenerationConfig;
  plan.bucketPadding = bucketPadding;
  plan.optimizer = optimizer;
  plan.runDefaults = runDefaults;
  plan.generation = generation;
  plan.adapter = adapter;
}

int64_t RuntimeFields::modelHiddenSize() const {
  if (!modelConfig.is_object()) return 0;
  const nlohmann::json& config = modelConfig.contains("text_config") ? modelConfig["text_config"] : modelConfig;
  return config.value("hidden_size", int64_t{0});
}

mlir::OwningOpRef<mlir::ModuleOp> buildModel(mlir::MLIRContext& context, const CompileOptions& options,
                                             RuntimeFields& fields, nlohmann::json& metadata) {
  if (options.maxNewTokens && (options.mode != "infer" || options.model == mlir::dg::kRmsNormMatmulSoftmaxName))
    throw InputError("--max-new-tokens: only DiffusionGemma inference plans (--mode infer) generate");
  if (options.model == mlir::dg::kRmsNormMatmulSoftmaxName) {
    if (isPretrainingObjective(options))
      throw InputError("--objective " + options.objective + ": " + std::string(mlir::dg::kRmsNormMatmulSoftmaxName) +
                       " has no pre-training objectives (they need a DiffusionGemma config)");
    if (options.imagesPerExample > 0)
      throw InputError("--images-per-example: " + std::string(mlir::dg::kRmsNormMatmulSoftmaxName) +
                       " has no vision_config (images need a DiffusionGemma config with one)");
    if (options.vocabAlignment != 1)
      throw InputError("--vocab-alignment: " + std::string(mlir::dg::kRmsNormMatmulSoftmaxName) +
                       " has no embedding to pad (the flag is for DiffusionGemma configs)");
    mlir::dg::RmsNormMatmulSoftmaxOptions builtin;
    builtin.microBatch = options.microBatch;
    builtin.sequenceLengths = parsePromptLengths(options.promptLengths);
    builtin.hiddenSize = options.hiddenSize;
    builtin.vocabSize = options.vocabSize;
    builtin.train = options.mode == "train";
    checkTokensPerMicroBatch(options.microBatch, builtin.sequenceLengths.back(), "longest --prompt-len", options);
    if (isMultiRank(options))
      throw InputError(std::string("--tp/--ep/--dp/--sp: ") + mlir::dg::kRmsNormMatmulSoftmaxName +
                       " has no parallel mapping; multi-rank layouts are for DiffusionGemma configs");
    return mlir::dg::buildRmsNormMatmulSoftmax(context, builtin);
  }

  const std::filesystem::path configPath = diffusionGemmaConfigPath(options);
  checkVocabAlignment(options.vocabAlignment);
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(configPath.string());
  for (const std::string& warning : config.warnings) std::cerr << "dgemma-compile: warning: " << warning << "\n";
  if (options.imagesPerExample > 0 && !config.hasVision)
    throw InputError("--images-per-example " + std::to_string(options.imagesPerExample) + ": " + configPath.string() +
                     " has no vision_config (a text-only model takes no images; drop the flag)");
  // A text-only plan stays byte-identical to one compiled before the flag existed.
  if (options.imagesPerExample > 0) metadata["images_per_example"] = options.imagesPerExample;
  // Block diffusion's blocks may have any length; the SFT and inference plans use the config's canvas.
  if (options.canvasLength != 0 && options.canvasLength != config.canvasLength &&
      options.objective != "block-diffusion")
    throw InputError("--canvas-len: " + std::to_string(options.canvasLength) +
                     " differs from the config's canvas_length " + std::to_string(config.canvasLength));
  const bool pretraining = isPretrainingObjective(options);
  const std::vector<int64_t> lengths =
      pretraining ? parseSequenceLengths(options.sequenceLengths) : parsePromptLengths(options.promptLengths);
  const int64_t longestPrompt = lengths.back();
  // A packed row has no canvas: its length alone is split like a prompt bucket (block diffusion's
  // decoder runs on blocks of --canvas-len).
  const int64_t decodedLength = !pretraining ? config.canvasLength
                                : options.objective == "block-diffusion"
                                    ? (options.canvasLength != 0 ? options.canvasLength : config.canvasLength)
                                    : lengths.front();
  checkContextParallelScope(options);
  checkParallelLayout(config, parallelLayout(options), lengths, decodedLength);
  config.paddedVocabSize = paddedVocabularySize(config.vocabSize, options.tp, options.vocabAlignment);
  // An unpadded plan stays byte-identical to one compiled before the flag existed.
  if (config.paddedVocabSize != config.vocabSize)
    metadata["vocabulary"] = {{"size", config.vocabSize}, {"padded_size", config.paddedVocabSize}};
  metadata["layout"] = {{"tp", options.tp},
                        {"dp", options.dp},
                        {"ep", options.ep},
                        {"sp", options.sequenceParallel},
                        {"distributed_optimizer", options.distributedOptimizer},
                        {"expert_exchange", options.expertExchange}};
  // A plan without context parallelism stays byte-identical to one compiled before the flag existed.
  if (options.cp > 1) metadata["layout"]["cp"] = options.cp;
  // The runtime resolves checkpoint names with the config (docs/model.md, "Checkpoint loading rules"), so the plan carries it.
  fields.family = ModelFamily::DiffusionGemma;
  fields.modelConfig = parseJson(readWholeFile(configPath.string()), configPath.string());
  // Checkpoints carry it (docs/training.md, "Checkpoints"); parsed here so that a bad one fails now.
  if (loadGenerationConfigBeside(configPath.string())) {
    const std::filesystem::path generationPath = configPath.parent_path() / "generation_config.json";
    fields.modelGenerationConfig = parseJson(readWholeFile(generationPath.string()), generationPath.string());
  }
  if (pretraining) {
    const mlir::dg::Precision precision = *mlir::dg::parsePrecision(options.precision);  // CLI11 checked the name
    metadata["precision"] = mlir::dg::precisionName(precision);
    const int64_t globalMicroBatch = options.microBatch * options.dp;
    checkTokensPerMicroBatch(globalMicroBatch, longestPrompt, "longest --seq-len", options);
    mlir::dg::DiffusionGemmaPretrainingOptions pretrain;
    pretrain.microBatch = globalMicroBatch;
    pretrain.sequenceLengths = lengths;
    pretrain.objective = pretrainingObjective(options, config, configPath.string());
    pretrain.precision = precision;
    const bool train = options.mode == "train";
    metadata["objective"] = pretrainingMetadata(pretrain.objective, train);
    if (train) return mlir::dg::buildDiffusionGemmaPretrain(context, config, pretrain);
    if (isMultiRank(options))
      throw InputError("--mode infer --objective " + options.objective +
                       ": the logits entry is built for one rank only; drop --tp/--ep/--dp/--sp");
    return mlir::dg::buildDiffusionGemmaPretrainLogits(context, config, pretrain);
  }
  // A batch whose prompts are shorter than a bucket runs in it left-padded: padding is masked and
  // occupies positions, and RoPE, the window and the decoder's prefix truncation all depend on
  // distances, so the result is the same up to rounding. The runtime crops prompt-length outputs back.
  // prefill's positions pad with -1: bucket padding lies left of every prompt position.
  namespace names = ::dgemma::diffusion_gemma;
  fields.bucketPadding =
      BucketPadding{names::kPromptLengthDimension,
                    1,
                    {{names::kInputIds, config.padTokenId}, {names::kAttentionMask, 0}, {names::kPositions, -1}},
                    {names::kEncoderHidden, names::kEncoderKeyPrefix, names::kEncoderValuePrefix}};
  // Image twins' prompt-length inputs (CONTRACT of the image entries, docs/cli.md): padding holds no
  // image token (index N·T, out of range) and no image run (segment 0).
  if (options.imagesPerExample > 0)
    fields.bucketPadding->inputs.insert(
        {{names::kImageTokenIndex,
          options.microBatch * options.dp * options.imagesPerExample * config.maxSoftTokensPerImage},
         {names::kImageSegmentIds, 0}});
  const mlir::dg::Precision precision = *mlir::dg::parsePrecision(options.precision);  // CLI11 checked the name
  metadata["precision"] = mlir::dg::precisionName(precision);
  // --micro-batch is per data-parallel rank (Megatron's micro_batch_size): the program is built for
  // the global micro-batch and the partitioner gives each rank its share.
  const int64_t globalMicroBatch = options.microBatch * options.dp;
  if (options.mode == "train") {
    checkTokensPerMicroBatch(globalMicroBatch, longestPrompt + config.canvasLength, "longest --prompt-len + canvas",
                             options);
    mlir::dg::DiffusionGemmaTrainOptions train;
    train.microBatch = globalMicroBatch;
    train.promptLengths = parsePromptLengths(options.promptLengths);
    train.objective = trainingObjective(options);
    train.precision = precision;
    train.imagesPerExample = options.imagesPerExample;
    train.sequenceMajorExpertTokens = options.cp > 1;
    metadata["objective"] = objectiveMetadata(train.objective);
    return mlir::dg::buildDiffusionGemmaTrain(context, config, train);
  }
  if (isMultiRank(options))
    throw InputError(
        "--mode infer: the inference entries (prefill, denoise, commit) are built for one rank only; "
        "drop --tp/--ep/--dp/--sp (sharded inference is later work)");
  mlir::dg::DiffusionGemmaInferenceOptions inference;
  inference.microBatch = globalMicroBatch;
  inference.promptLengths = parsePromptLengths(options.promptLengths);
  inference.precision = precision;
  inference.imagesPerExample = options.imagesPerExample;
  fields.generation = generationSettings(options, config, inference.promptLengths.back());
  inference.cacheLength = fields.generation->cacheLength;
  checkTokensPerMicroBatch(globalMicroBatch, longestPrompt + inference.cacheLength + config.canvasLength,
                           "longest --prompt-len + cache + canvas", options);
  metadata["max_new_tokens"] = fields.generation->maxNewTokens;
  return mlir::dg::buildDiffusionGemmaInference(context, config, inference);
}

void checkTensorSizes(mlir::ModuleOp module) {
  auto check = [](mlir::Type type, mlir::Location location) {
    auto tensor = mlir::dyn_cast<mlir::RankedTensorType>(type);
    if (!tensor) return;
    std::string where;
    llvm::raw_string_ostream stream(where);
    location.print(stream);
    const std::vector<int64_t> shape(tensor.getShape().begin(), tensor.getShape().end());
    const mlir::Type element = tensor.getElementType();
    const int64_t elementBytes = element.isIntOrFloat() ? (element.getIntOrFloatBitWidth() + 7) / 8 : 8;
    const std::optional<int64_t> bytes =
        tensor.hasStaticShape() ? checkedTensorBytes(shape, elementBytes) : std::nullopt;
    if (!bytes || *bytes > kMaxTensorBytes)
      throw InputError("the model config and flags give a tensor larger than " + formatBytes(kMaxTensorBytes) +
                       " (the bound on one tensor): " + where +
                       (tensor.hasStaticShape() ? " of shape " + shapeToString(shape) : " (its size overflows)") +
                       "; reduce the config's sizes, --micro-batch or --prompt-len");
  };
  module.walk([&](mlir::Operation* op) {
    for (mlir::Value result : op->getResults()) check(result.getType(), op->getLoc());
    for (mlir::Region& region : op->getRegions())
      for (mlir::Block& block : region)
        for (mlir::BlockArgument argument : block.getArguments()) check(argument.getType(), op->getLoc());
  });
}

}  // namespace dgemma
