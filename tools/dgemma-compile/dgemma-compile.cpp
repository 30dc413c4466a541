// dgemma-compile: model config + parallel layout -> executable plan (one file per rank).
#include <algorithm>
#include <ctime>
#include <filesystem>
#include <optional>
#include <fstream>
#include <iostream>
#include <sstream>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "dialects/dg/IR/DgDialect.h"
#include "dialects/dg/IR/DgOps.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "llvm/Support/SourceMgr.h"
#include "models/builtin/RmsNormMatmulSoftmax.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/GenerationConfig.h"
#include "support/PathClash.h"
#include "models/diffusion_gemma/ir/Inference.h"
#include "models/diffusion_gemma/spec/ParallelLayout.h"
#include "models/diffusion_gemma/spec/Presets.h"
#include "support/AtomicFile.h"
#include "support/CheckedSize.h"
#include "support/Json.h"
#include "support/Shape.h"
#include "plan/PlanFile.h"
#include "tools/common/CliSupport.h"
#include "tools/common/FlagRanges.h"
#include "tools/dgemma-compile/AutoLayout.h"
#include "tools/dgemma-compile/Report.h"

namespace {

using dgemma::InputError;

// The ranges of the numeric flags (docs/cli.md, "Flag ranges"): far beyond any real run, and small
// enough that the sizes built from them cannot overflow.
constexpr int64_t kMaxMicroBatch = 65536;
constexpr int64_t kMaxLength = int64_t{1} << 20;  // --prompt-len, --canvas-len, --max-new-tokens
constexpr int64_t kMaxBuiltinSize = 65536;        // --hidden-size, --vocab-size of the built-in graph
constexpr int64_t kMaxParallel = 1024;            // --tp, --ep, --dp
constexpr int64_t kMaxImagesPerExample = 1024;
constexpr double kMaxWeight = 1e6;                // loss weights, coefficients, clips, weight decay
constexpr double kMaxGradNorm = 1e30;
// Tokens of one global micro-batch (micro-batch x DP x (longest prompt + canvas + cache)): the
// builder lays out position tables of this many entries before any size is checked.
constexpr int64_t kMaxTokensPerMicroBatch = int64_t{1} << 24;

struct CompileFlags {
  std::string model;
  std::string mode;
  std::string preset;
  std::string objective = "base-sft";
  double selfCondProb = 0.5;  // docs/training.md, "Self-conditioning": dgemma's default training config (the MB recipe)
  double encoderLossWeight = 1.0;
  double decoderLossWeight = 1.0;
  std::optional<double> weightClip;
  double auxLossCoeff = 0.0;
  double noiseMin = 1e-3, noiseMax = 1.0 - 1e-3;
  dgemma::OptimizerSettings adam;
  int64_t microBatch = 2;
  int64_t imagesPerExample = 0;  // --images-per-example: 0 = a text-only plan (docs/cli.md)
  std::string promptLengths = "8";
  int64_t canvasLength = 0;  // 0: the model config's canvas_length
  std::optional<int64_t> maxNewTokens;  // unset: generation_config.json's max_new_tokens, else 256
  int64_t hiddenSize = 64;
  int64_t vocabSize = 128;
  int64_t tp = 1, ep = 1, dp = 1;
  bool sequenceParallel = false;
  bool distributedOptimizer = true;
  std::string expertExchange = "all-gather";  // all-gather | all-to-all
  std::string recompute = "none";
  std::string backwardOrder = "scheduled";  // scheduled (dg-backward-schedule) | autodiff
  std::string fusion = "on";  // dg-fuse-elementwise
  std::string precision = "fp32";
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

// Every rank must run the same collectives in the same order, or they wait on each other forever.
// The passes that order ops (dg-backward-schedule, dg-memory-plan) decide per rank from its own
// program, so the compiled plans are compared before any is written.
void checkCollectiveOrder(const std::vector<dgemma::Plan>& plans) {
  for (size_t rank = 1; rank < plans.size(); ++rank)
    for (size_t e = 0; e < plans[0].entryPoints.size(); ++e) {
      auto collectives = [&](const dgemma::Plan& plan) {
        std::vector<std::string> sequence;
        for (const dgemma::Step& step : plan.entryPoints[e].steps)
          if (step.kind == dgemma::Step::Kind::Collective) sequence.push_back(step.op + " over " + step.axis + " at " + step.location);
        return sequence;
      };
      const std::vector<std::string> want = collectives(plans[0]), got = collectives(plans[rank]);
      if (got == want) continue;
      size_t at = 0;
      while (at < want.size() && at < got.size() && want[at] == got[at]) ++at;
      throw InputError("entry point " + plans[0].entryPoints[e].key() + ": rank " + std::to_string(rank) +
                       "'s collective " + std::to_string(at) + " is " + (at < got.size() ? got[at] : "missing") +
                       ", rank 0's is " + (at < want.size() ? want[at] : "missing") +
                       " (a compiler bug; --backward-order autodiff keeps autodiff's order)");
    }
}

std::vector<int64_t> parseLengths(const std::string& text) {
  std::vector<int64_t> lengths;
  std::stringstream stream(text);
  std::string item;
  while (std::getline(stream, item, ',')) {
    try {
      size_t used = 0;
      int64_t value = std::stoll(item, &used);
      if (used != item.size() || value < 1 || value > kMaxLength) throw std::invalid_argument(item);
      lengths.push_back(value);
    } catch (const std::logic_error&) {
      throw InputError("--prompt-len: expected integers in [1, " + std::to_string(kMaxLength) +
                       "] separated by commas, got " + dgemma::quoteForMessage(text, 40));
    }
  }
  if (lengths.empty()) throw InputError("--prompt-len: expected at least one length");
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return lengths;
}

dgemma::ParallelLayout parallelLayout(const CompileFlags& flags) {
  return dgemma::ParallelLayout{flags.tp, flags.dp, flags.ep, flags.sequenceParallel};
}

mlir::dg::ShardingOptions shardingOptions(const CompileFlags& flags) {
  mlir::dg::ShardingOptions options{flags.tp, flags.dp, flags.ep, flags.sequenceParallel, flags.distributedOptimizer};
  options.expertAllToAll = flags.expertExchange == "all-to-all";
  return options;
}

bool isMultiRank(const CompileFlags& flags) {
  return flags.tp != 1 || flags.ep != 1 || flags.dp != 1 || flags.sequenceParallel;
}

// Flags whose features later work adds are rejected now rather than silently ignored.
void rejectUnbuiltFeatures(const CompileFlags& flags) {
  if (flags.precision != "fp32" && flags.model == mlir::dg::kRmsNormMatmulSoftmaxName)
    throw InputError("--precision " + flags.precision + ": only DiffusionGemma configs build mixed precision; " +
                     mlir::dg::kRmsNormMatmulSoftmaxName + " is fp32 only");
}

// The objective flags (docs/training.md, "The objective"), validated.
mlir::dg::DiffusionGemmaObjective trainingObjective(const CompileFlags& flags) {
  mlir::dg::DiffusionGemmaObjective objective;
  objective.variant = *mlir::dg::parseObjectiveVariant(flags.objective);  // CLI11 checked the name
  // Each flag's own range is checked as it is parsed (docs/cli.md, "Flag ranges"); here only how they relate.
  if (!(flags.noiseMin <= flags.noiseMax))
    throw InputError("--noise-min/--noise-max: expected 0 <= noise_min <= noise_max <= 1");
  objective.selfConditioningProb = flags.selfCondProb;
  objective.encoderLossWeight = flags.encoderLossWeight;
  objective.decoderLossWeight = flags.decoderLossWeight;
  objective.routerAuxLossCoeff = flags.auxLossCoeff;
  objective.weightClip = flags.weightClip;
  objective.noiseMin = flags.noiseMin;
  objective.noiseMax = flags.noiseMax;
  const bool reweighted = objective.variant == mlir::dg::DiffusionGemmaObjective::Variant::ReweightedCe ||
                          objective.variant == mlir::dg::DiffusionGemmaObjective::Variant::ReweightedLooCe;
  if (reweighted && !objective.weightClip)
    std::cerr << "dgemma-compile: warning: --objective " << flags.objective
              << " without --weight-clip: the weight 1/(1-t) reaches " << 1.0 / std::max(1.0 - flags.noiseMax, 1e-12)
              << " at t = noise_max (docs/training.md, 'The four objectives', suggests a clip of 100)\n";
  return objective;
}

nlohmann::json objectiveMetadata(const mlir::dg::DiffusionGemmaObjective& objective) {
  return {{"variant", mlir::dg::objectiveVariantName(objective.variant)},
          {"weight_clip", objective.weightClip ? nlohmann::json(*objective.weightClip) : nlohmann::json(nullptr)},
          {"self_conditioning_prob", objective.selfConditioningProb},
          {"decoder_loss_weight", objective.decoderLossWeight},
          {"encoder_loss_weight", objective.encoderLossWeight},
          {"router_aux_loss_coeff", objective.routerAuxLossCoeff},
          {"noise_min", objective.noiseMin},
          {"noise_max", objective.noiseMax}};
}

// The typed plan fields that drive the runtime (docs/plan-format.md), gathered while the model is
// built and copied into the lowered plan.
struct RuntimeFields {
  dgemma::ModelFamily family = dgemma::ModelFamily::Builtin;
  nlohmann::json modelConfig;
  nlohmann::json modelGenerationConfig;
  std::optional<dgemma::BucketPadding> bucketPadding;
  std::optional<dgemma::OptimizerSettings> optimizer;
  std::optional<dgemma::RunDefaults> runDefaults;
  std::optional<dgemma::GenerationSettings> generation;

  void copyInto(dgemma::Plan& plan) const {
    plan.modelFamily = family;
    plan.modelConfig = modelConfig;
    plan.modelGenerationConfig = modelGenerationConfig;
    plan.bucketPadding = bucketPadding;
    plan.optimizer = optimizer;
    plan.runDefaults = runDefaults;
    plan.generation = generation;
  }
};

// The generation settings of an inference plan (docs/inference-plan.md): the model's
// generation_config.json (beside --model) over HF's defaults; --max-new-tokens sizes the cache.
dgemma::GenerationSettings generationSettings(const CompileFlags& flags, const dgemma::DiffusionGemmaConfig& config,
                                              int64_t maxPromptLength) {
  const dgemma::DiffusionGemmaGenerationConfig file = dgemma::loadGenerationConfigBeside(flags.model).value_or(
      dgemma::DiffusionGemmaGenerationConfig{});
  dgemma::checkGenerationTokenIds(file, config.vocabSize);
  dgemma::GenerationSettings settings;
  settings.canvasLength = config.canvasLength;
  settings.maxNewTokens = flags.maxNewTokens.value_or(file.maxNewTokens);
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
                              const CompileFlags& flags) {
  const std::optional<int64_t> tokens = dgemma::checkedMultiply(globalMicroBatch, tokensPerExample);
  if (!tokens || *tokens > kMaxTokensPerMicroBatch)
    throw InputError("--micro-batch " + std::to_string(flags.microBatch) + (flags.dp > 1 ? " x --dp " + std::to_string(flags.dp) : "") +
                     " with " + std::to_string(tokensPerExample) + " tokens per example (" + perExample +
                     "): more than " + std::to_string(kMaxTokensPerMicroBatch) + " tokens per micro-batch");
}

// Every tensor of the built program must have a static shape whose bytes fit kMaxTensorBytes:
// the memory planner and the runtime size arenas from them. Checked before any pass runs, so a
// config or flags too large to hold end here, naming the tensor, and not in a verifier dump.
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
        tensor.hasStaticShape() ? dgemma::checkedTensorBytes(shape, elementBytes) : std::nullopt;
    if (!bytes || *bytes > dgemma::kMaxTensorBytes)
      throw InputError("the model config and flags give a tensor larger than " + dgemma::formatBytes(dgemma::kMaxTensorBytes) +
                       " (the bound on one tensor): " + where +
                       (tensor.hasStaticShape() ? " of shape " + dgemma::shapeToString(shape) : " (its size overflows)") +
                       "; reduce the config's sizes, --micro-batch or --prompt-len");
  };
  module.walk([&](mlir::Operation* op) {
    for (mlir::Value result : op->getResults()) check(result.getType(), op->getLoc());
    for (mlir::Region& region : op->getRegions())
      for (mlir::Block& block : region)
        for (mlir::BlockArgument argument : block.getArguments()) check(argument.getType(), op->getLoc());
  });
}

// The config.json --model names (an HF checkpoint directory or the file itself).
std::filesystem::path diffusionGemmaConfigPath(const CompileFlags& flags) {
  std::filesystem::path path(flags.model);
  std::filesystem::path configPath = std::filesystem::is_directory(path) ? path / "config.json" : path;
  if (!std::filesystem::exists(configPath))
    throw InputError("--model: " + configPath.string() + " does not exist (expected an HF checkpoint directory, a config.json or " +
                     mlir::dg::kRmsNormMatmulSoftmaxName + ")");
  return configPath;
}

// --auto-layout: ranks every legal layout and recompute policy of --gpus ranks by the cost model,
// prints the table, sets the chosen layout into `flags` and returns its prediction; throws
// InputError when no candidate this build compiles fits.
dgemma::CostPrediction searchLayout(CompileFlags& flags) {
  if (flags.mode != "train") throw InputError("--auto-layout: only --mode train plans are sharded (inference is single-rank)");
  if (flags.model == mlir::dg::kRmsNormMatmulSoftmaxName)
    throw InputError(std::string("--auto-layout: ") + mlir::dg::kRmsNormMatmulSoftmaxName + " has no parallel mapping");
  if (!flags.explicitLayoutFlags.empty())
    throw InputError("--auto-layout: " + flags.explicitLayoutFlags.front() + " is chosen by the layout search; drop it (or drop --auto-layout)");
  if (flags.gpus == 0) throw InputError("--auto-layout: --gpus N is required (the number of ranks to lay out)");
  const dgemma::DiffusionGemmaConfig config = dgemma::loadDiffusionGemmaConfig(diffusionGemmaConfigPath(flags).string());
  dgemma::LayoutSearchRequest request;
  request.gpus = flags.gpus;
  request.accelerator = &dgemma::findAccelerator(flags.gpu.empty() ? "h200" : flags.gpu);
  request.memoryBytesPerGpu =
      flags.gpuMemory.empty() ? request.accelerator->memoryBytes : dgemma::parseByteSize(flags.gpuMemory, "--gpu-memory");
  request.promptLengths = parseLengths(flags.promptLengths);
  request.shape.microBatch = flags.microBatch;
  request.shape.promptLength = request.promptLengths.back();
  request.shape.canvasLength = config.canvasLength;
  request.shape.bf16 = flags.precision == "bf16";
  request.shape.selfConditioning = flags.selfCondProb > 0;
  request.shape.encoderLoss = flags.encoderLossWeight > 0;
  request.shape.routerAuxLoss = flags.auxLossCoeff > 0;
  request.shape.distributedOptimizer = flags.distributedOptimizer;
  // A policy is built when the compiler takes it as an explicit --recompute.
  auto unbuiltReason = [&](dgemma::RecomputePolicy policy) -> std::string {
    CompileFlags trial = flags;
    trial.recompute = dgemma::recomputeName(policy);
    try {
      rejectUnbuiltFeatures(trial);
    } catch (const InputError& error) {
      return error.what();
    }
    return "";
  };
  const dgemma::LayoutSearch search = dgemma::searchLayouts(config, request, unbuiltReason);
  // With --emit, stdout carries the IR; the table goes to stderr.
  dgemma::printLayoutSearch(search, request, flags.emit.empty() ? std::cout : std::cerr);
  if (!search.chosen)
    throw InputError("--auto-layout: no layout of --gpus " + std::to_string(flags.gpus) + " that this build compiles fits --gpu-memory " +
                     dgemma::formatBytes(request.memoryBytesPerGpu) + " (see the table above)");
  const dgemma::RankedCandidate& chosen = search.ranked[*search.chosen];
  flags.tp = chosen.candidate.layout.tensorParallel;
  flags.dp = chosen.candidate.layout.dataParallel;
  flags.ep = chosen.candidate.layout.expertParallel;
  flags.sequenceParallel = chosen.candidate.layout.sequenceParallel;
  flags.recompute = dgemma::recomputeName(chosen.candidate.recompute);
  return chosen.prediction;
}

// Builds the module; records in `fields` what the runtime needs to know about the model and in
// `metadata` what is informational.
mlir::OwningOpRef<mlir::ModuleOp> buildModel(mlir::MLIRContext& context, const CompileFlags& flags, RuntimeFields& fields,
                                             nlohmann::json& metadata) {
  if (flags.maxNewTokens && (flags.mode != "infer" || flags.model == mlir::dg::kRmsNormMatmulSoftmaxName))
    throw InputError("--max-new-tokens: only DiffusionGemma inference plans (--mode infer) generate");
  if (flags.model == mlir::dg::kRmsNormMatmulSoftmaxName) {
    if (flags.imagesPerExample > 0)
      throw InputError("--images-per-example: " + std::string(mlir::dg::kRmsNormMatmulSoftmaxName) +
                       " has no vision_config (images need a DiffusionGemma config with one)");
    mlir::dg::RmsNormMatmulSoftmaxOptions options;
    options.microBatch = flags.microBatch;
    options.sequenceLengths = parseLengths(flags.promptLengths);
    options.hiddenSize = flags.hiddenSize;
    options.vocabSize = flags.vocabSize;
    options.train = flags.mode == "train";
    checkTokensPerMicroBatch(flags.microBatch, options.sequenceLengths.back(), "longest --prompt-len", flags);
    if (isMultiRank(flags))
      throw InputError(std::string("--tp/--ep/--dp/--sp: ") + mlir::dg::kRmsNormMatmulSoftmaxName +
                       " has no parallel mapping; multi-rank layouts are for DiffusionGemma configs");
    return mlir::dg::buildRmsNormMatmulSoftmax(context, options);
  }

  const std::filesystem::path configPath = diffusionGemmaConfigPath(flags);
  dgemma::DiffusionGemmaConfig config = dgemma::loadDiffusionGemmaConfig(configPath.string());
  for (const std::string& warning : config.warnings) std::cerr << "dgemma-compile: warning: " << warning << "\n";
  if (flags.imagesPerExample > 0 && !config.hasVision)
    throw InputError("--images-per-example " + std::to_string(flags.imagesPerExample) + ": " + configPath.string() +
                     " has no vision_config (a text-only model takes no images; drop the flag)");
  // A text-only plan stays byte-identical to one compiled before the flag existed.
  if (flags.imagesPerExample > 0) metadata["images_per_example"] = flags.imagesPerExample;
  if (flags.canvasLength != 0 && flags.canvasLength != config.canvasLength)
    throw InputError("--canvas-len: " + std::to_string(flags.canvasLength) + " differs from the config's canvas_length " +
                     std::to_string(config.canvasLength));
  const int64_t longestPrompt = parseLengths(flags.promptLengths).back();
  dgemma::checkParallelLayout(config, parallelLayout(flags), parseLengths(flags.promptLengths), config.canvasLength);
  metadata["layout"] = {{"tp", flags.tp}, {"dp", flags.dp}, {"ep", flags.ep}, {"sp", flags.sequenceParallel},
                        {"distributed_optimizer", flags.distributedOptimizer}, {"expert_exchange", flags.expertExchange}};
  // The runtime resolves checkpoint names with the config (docs/model.md, "Checkpoint loading rules"), so the plan carries it.
  fields.family = dgemma::ModelFamily::DiffusionGemma;
  fields.modelConfig = dgemma::parseJson(dgemma::readWholeFile(configPath.string()), configPath.string());
  // Checkpoints carry it (docs/training.md, "Checkpoints"); parsed here so that a bad one fails now.
  if (dgemma::loadGenerationConfigBeside(configPath.string())) {
    const std::filesystem::path generationPath = configPath.parent_path() / "generation_config.json";
    fields.modelGenerationConfig = dgemma::parseJson(dgemma::readWholeFile(generationPath.string()), generationPath.string());
  }
  // A batch whose prompts are shorter than a bucket runs in it left-padded: padding is masked and
  // occupies positions, and RoPE, the window and the decoder's prefix truncation all depend on
  // distances, so the result is the same up to rounding. The runtime crops prompt-length outputs back.
  // prefill's positions pad with -1: bucket padding lies left of every prompt position.
  fields.bucketPadding = dgemma::BucketPadding{"prompt_len",
                                               1,
                                               {{"input_ids", config.padTokenId}, {"attention_mask", 0}, {"positions", -1}},
                                               {"encoder_hidden", "encoder_k.", "encoder_v."}};
  // Image twins' prompt-length inputs (CONTRACT of the image entries, docs/cli.md): padding holds no
  // image token (index N·T, out of range) and no image run (segment 0).
  if (flags.imagesPerExample > 0)
    fields.bucketPadding->inputs.insert({{"image_token_index", flags.microBatch * flags.dp * flags.imagesPerExample *
                                                                   config.maxSoftTokensPerImage},
                                         {"image_segment_ids", 0}});
  const mlir::dg::Precision precision = *mlir::dg::parsePrecision(flags.precision);  // CLI11 checked the name
  metadata["precision"] = mlir::dg::precisionName(precision);
  // --micro-batch is per data-parallel rank (Megatron's micro_batch_size): the program is built for
  // the global micro-batch and the partitioner gives each rank its share.
  const int64_t globalMicroBatch = flags.microBatch * flags.dp;
  if (flags.mode == "train") {
    checkTokensPerMicroBatch(globalMicroBatch, longestPrompt + config.canvasLength, "longest --prompt-len + canvas", flags);
    mlir::dg::DiffusionGemmaTrainOptions options;
    options.microBatch = globalMicroBatch;
    options.promptLengths = parseLengths(flags.promptLengths);
    options.objective = trainingObjective(flags);
    options.precision = precision;
    options.imagesPerExample = flags.imagesPerExample;
    metadata["objective"] = objectiveMetadata(options.objective);
    return mlir::dg::buildDiffusionGemmaTrain(context, config, options);
  }
  if (isMultiRank(flags))
    throw InputError("--mode infer: the inference entries (prefill, denoise, commit) are built for one rank only; "
                     "drop --tp/--ep/--dp/--sp (sharded inference is later work)");
  mlir::dg::DiffusionGemmaInferenceOptions options;
  options.microBatch = globalMicroBatch;
  options.promptLengths = parseLengths(flags.promptLengths);
  options.precision = precision;
  options.imagesPerExample = flags.imagesPerExample;
  fields.generation = generationSettings(flags, config, options.promptLengths.back());
  options.cacheLength = fields.generation->cacheLength;
  checkTokensPerMicroBatch(globalMicroBatch, longestPrompt + options.cacheLength + config.canvasLength,
                           "longest --prompt-len + cache + canvas", flags);
  metadata["max_new_tokens"] = fields.generation->maxNewTokens;
  return mlir::dg::buildDiffusionGemmaInference(context, config, options);
}

// The text model's hidden size, for the report's analytic minimum (0 for the built-in graph).
int64_t modelHiddenSize(const RuntimeFields& fields) {
  if (!fields.modelConfig.is_object()) return 0;
  const nlohmann::json& config = fields.modelConfig.contains("text_config") ? fields.modelConfig["text_config"] : fields.modelConfig;
  return config.value("hidden_size", int64_t{0});
}

// A preset's values fill the flags the command line left unset (explicit flags win), through
// CLI11 so that they pass the same checks as typed ones.
void applyPreset(CLI::App& app, const std::string& name) {
  const dgemma::Preset& preset = dgemma::findPreset(name);
  for (const auto& [flag, value] : preset.compile.items()) {
    CLI::Option* option = app.get_option("--" + flag);
    if (option->count() > 0) continue;
    option->add_result(value.is_string() ? value.get<std::string>() : value.dump());
    try {
      option->run_callback();
    } catch (const CLI::ParseError& error) {
      throw InputError("--preset " + name + ": --" + flag + ": " + error.what());
    }
  }
}

int compile(CompileFlags flags) {
  if (flags.mode != "train" && flags.mode != "infer") throw InputError("--mode: expected train or infer");
  if (!flags.autoLayout && (flags.gpus != 0 || !flags.gpuMemory.empty() || !flags.gpu.empty()))
    throw InputError(std::string(flags.gpus != 0 ? "--gpus" : !flags.gpuMemory.empty() ? "--gpu-memory" : "--gpu") +
                     ": only with --auto-layout");
  std::optional<dgemma::CostPrediction> predicted;
  if (flags.autoLayout) {
    predicted = searchLayout(flags);
    if (flags.emit.empty() && flags.output.empty()) return 0;  // the table alone
  }
  rejectUnbuiltFeatures(flags);
  if (flags.emit.empty() && flags.output.empty()) throw InputError("-o: an output plan directory is required (or --emit)");
  // CLI11 checked the policy's form.
  const mlir::dg::RecomputePolicy recompute = *mlir::dg::parseRecomputePolicy(flags.recompute);
  if (recompute.kind != mlir::dg::RecomputePolicy::Kind::None && flags.mode != "train")
    throw InputError("--recompute " + flags.recompute + ": only --mode train has a backward that recomputes (use none)");

  mlir::MLIRContext context;
  // Diagnostics go to stderr as "loc: error: message"; a failed stage is bad input (exit 2).
  llvm::SourceMgr sourceManager;
  mlir::SourceMgrDiagnosticHandler diagnostics(sourceManager, &context, llvm::errs());
  nlohmann::json metadata = {
      {"model", flags.model}, {"mode", flags.mode}, {"backend", flags.backend}, {"recompute", recompute.name()},
      {"fusion", flags.fusion}};
  RuntimeFields fields;
  if (!flags.preset.empty()) {
    // dgemma-run train takes its defaults (rate, schedule, steps, ...) from here.
    metadata["preset"] = flags.preset;
    fields.runDefaults = dgemma::RunDefaults{flags.preset, dgemma::findPreset(flags.preset).train};
  }
  mlir::OwningOpRef<mlir::ModuleOp> module = buildModel(context, flags, fields, metadata);
  checkTensorSizes(*module);
  if (mlir::failed(mlir::verify(*module))) throw InputError("the built model IR does not verify (see above)");
  if (flags.emit == "dg") {
    module->print(llvm::outs());
    llvm::outs() << "\n";
    return 0;
  }

  mlir::dg::PassTimes passTimes;  // --report: the time of each pass, and of the lowering and validation
  auto timed = [&](const char* phase, auto work) {
    const std::clock_t start = std::clock();
    work();
    passTimes.seconds[phase] += double(std::clock() - start) / CLOCKS_PER_SEC;
    ++passTimes.runs[phase];
  };
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = flags.mode == "train";
  pipeline.recompute = recompute;
  pipeline.scheduleBackward = flags.backwardOrder == "scheduled";
  pipeline.fusion = flags.fusion == "on";
  std::map<std::string, mlir::dg::EntryMemoryPlan> rankMemory;  // --report: this rank's planner numbers per entry
  if (flags.report) {
    pipeline.passTimes = &passTimes;
    pipeline.memoryPlanObserver = [&](mlir::func::FuncOp function, const mlir::dg::EntryMemoryPlan& memory) {
      rankMemory[function.getSymName().str()] = memory;
    };
  }
  if (pipeline.train) {
    pipeline.optimizer = flags.adam;  // each setting's range is checked as its flag is parsed
    fields.optimizer = pipeline.optimizer;
  }
  if (mlir::failed(mlir::dg::runDifferentiationStage(*module, pipeline))) throw InputError("differentiation failed (see above)");
  if (flags.emit == "autodiff") {
    module->print(llvm::outs());
    llvm::outs() << "\n";
    return 0;
  }
  const bool multiRank = isMultiRank(flags);
  mlir::dg::ShardingOptions layout = shardingOptions(flags);
  layout.passTimes = pipeline.passTimes;
  if (multiRank && mlir::failed(mlir::dg::runShardingStage(*module, layout)))
    throw InputError("sharding failed (see above)");
  if (flags.emit == "sharded") {
    module->print(llvm::outs());
    llvm::outs() << "\n";
    return 0;
  }

  // One plan per rank, each from its own partition of the annotated module.
  const int64_t worldSize = multiRank ? shardingOptions(flags).worldSize() : 1;
  std::vector<dgemma::Plan> plans;
  std::vector<RankReport> reports;
  for (int64_t rank = 0; rank < worldSize; ++rank) {
    mlir::OwningOpRef<mlir::ModuleOp> partition;
    if (multiRank) {
      auto partitioned = mlir::dg::partitionForRank(*module, rank, layout);
      if (mlir::failed(partitioned)) throw InputError("partitioning for rank " + std::to_string(rank) + " failed (see above)");
      partition = std::move(*partitioned);
    }
    mlir::ModuleOp program = multiRank ? *partition : *module;
    if (mlir::failed(mlir::dg::runRecomputationStage(program, pipeline))) throw InputError("recomputation failed (see above)");
    if (flags.emit == "recompute") {  // rank 0's program
      program.print(llvm::outs());
      llvm::outs() << "\n";
      return 0;
    }
    rankMemory.clear();
    if (mlir::failed(mlir::dg::runPlanningStage(program, pipeline))) throw InputError("memory planning failed (see above)");
    mlir::dg::PlanLoweringOptions lowering;
    lowering.producer = "dgemma-compile";
    lowering.metadata = metadata;
    if (multiRank) lowering.rank = rank;
    mlir::FailureOr<dgemma::Plan> plan = mlir::failure();
    timed("(lowering to a plan)", [&] { plan = mlir::dg::lowerToPlan(program, lowering); });
    if (mlir::failed(plan)) throw InputError("lowering to a plan failed (see above)");
    fields.copyInto(*plan);
    timed("(plan validation)", [&] { dgemma::validatePlan(*plan, "<compiled plan of rank " + std::to_string(rank) + ">"); });
    if (flags.emit == "plan-json") {
      std::cout << dgemma::planToJson(*plan).dump(2) << "\n";
      return 0;
    }
    if (flags.report) {
      if (rank == 0) printEntryReport(program, *plan);
      reports.push_back(rankReport(program, *plan, rankMemory));
    }
    if (predicted && rank == 0) dgemma::printPredictionCheck(*predicted, dgemma::compiledRankCost(program, *plan), std::cout);
    plans.push_back(std::move(*plan));
  }
  if (flags.report) {
    printRankReport(reports, analyticMinimum(*module, shardingOptions(flags), modelHiddenSize(fields)));
    printPassTimes(passTimes);
  }

  checkCollectiveOrder(plans);
  dgemma::createOutputDirectory(flags.output, "-o");
  for (const dgemma::Plan& plan : plans) dgemma::writePlanFile(plan, dgemma::planFileForRank(flags.output, plan.rank));
  std::cerr << "dgemma-compile: wrote " << plans.size() << " plan" << (plans.size() == 1 ? "" : "s") << " to "
            << flags.output << " (" << plans.front().entryPoints.size() << " entry points, "
            << plans.front().parameters.size() << " parameters per rank)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CompileFlags flags;
  CLI::App app{"dgemma-compile: model config + parallel layout -> executable plan (one file per rank)", "dgemma-compile"};
  app.add_option("--model", flags.model,
                 std::string("HF checkpoint dir or config.json, or ") + mlir::dg::kRmsNormMatmulSoftmaxName)->required();
  app.add_option("--mode", flags.mode, "train | infer")->required()->check(CLI::IsMember({"train", "infer"}));
  app.add_option("--preset", flags.preset, "named recipe defaults: dg26b-sft, tiny-cpu, demo (explicit flags win)");
  app.add_option("--objective", flags.objective, "base-sft | reweighted-ce | loo-ce | reweighted-loo-ce")
      ->check(CLI::IsMember({"base-sft", "reweighted-ce", "loo-ce", "reweighted-loo-ce"}));
  app.add_option("--self-cond-prob", flags.selfCondProb, "self-conditioning probability")->check(dgemma::numberIn(0, 1));
  app.add_option("--encoder-loss-weight", flags.encoderLossWeight, "clean-target encoder loss weight")->check(dgemma::numberIn(0, kMaxWeight));
  app.add_option("--weight-clip", flags.weightClip, "clip of the reweighted objectives' weight (default: none)")
      ->check(dgemma::numberIn(0, kMaxWeight, false));
  app.add_option("--decoder-loss-weight", flags.decoderLossWeight, "denoising decoder loss weight")->check(dgemma::numberIn(0, kMaxWeight));
  app.add_option("--aux-loss-coeff", flags.auxLossCoeff, "router load-balancing loss coefficient")->check(dgemma::numberIn(0, kMaxWeight));
  app.add_option("--noise-min", flags.noiseMin, "lower end of the diffusion time t")->check(dgemma::numberIn(0, 1));
  app.add_option("--noise-max", flags.noiseMax, "upper end of the diffusion time t")->check(dgemma::numberIn(0, 1));
  app.add_option("--adam-beta1", flags.adam.beta1, "AdamW beta1 (docs/training.md, 'AdamW and clipping')")
      ->check(dgemma::numberIn(0, 1, true, false));
  app.add_option("--adam-beta2", flags.adam.beta2, "AdamW beta2")->check(dgemma::numberIn(0, 1, true, false));
  app.add_option("--adam-eps", flags.adam.epsilon, "AdamW epsilon")->check(dgemma::numberIn(0, 1, false));
  app.add_option("--weight-decay", flags.adam.weightDecay, "decoupled weight decay")->check(dgemma::numberIn(0, kMaxWeight));
  app.add_option("--clip-grad", flags.adam.maxGradNorm, "global gradient-norm bound")->check(dgemma::numberIn(0, kMaxGradNorm, false));
  app.add_option("--micro-batch", flags.microBatch, "examples per micro-batch")->check(dgemma::integerIn(1, kMaxMicroBatch));
  app.add_option("--images-per-example", flags.imagesPerExample,
                 "images in every example of an image micro-batch; >= 1 builds the image twins of the prompt entries "
                 "(needs a vision_config; default 0: a text-only plan)")
      ->check(dgemma::integerIn(0, kMaxImagesPerExample));
  app.add_option("--prompt-len", flags.promptLengths, "prompt-length buckets, e.g. 128,256,512");
  app.add_option("--canvas-len", flags.canvasLength, "decoder canvas length (default: the config's canvas_length)")
      ->check(dgemma::integerIn(1, kMaxLength));
  app.add_option("--max-new-tokens", flags.maxNewTokens,
                 "infer: the most tokens a generation may ask for; sizes the K/V cache (default: generation_config.json's "
                 "max_new_tokens, else 256)")
      ->check(dgemma::integerIn(1, kMaxLength));
  app.add_option("--hidden-size", flags.hiddenSize, "hidden size of the built-in graph")->check(dgemma::integerIn(1, kMaxBuiltinSize));
  app.add_option("--vocab-size", flags.vocabSize, "output size of the built-in graph")->check(dgemma::integerIn(1, kMaxBuiltinSize));
  app.add_option("--tp", flags.tp, "tensor-parallel size")->check(dgemma::integerIn(1, kMaxParallel));
  app.add_option("--ep", flags.ep, "expert-parallel size")->check(dgemma::integerIn(1, kMaxParallel));
  app.add_option("--dp", flags.dp, "data-parallel size")->check(dgemma::integerIn(1, kMaxParallel));
  app.add_flag("--sp", flags.sequenceParallel, "sequence parallelism");
  app.add_flag("--distributed-optimizer,!--no-distributed-optimizer", flags.distributedOptimizer,
               "ZeRO-1: optimizer state sharded over the data-parallel ranks (default on)");
  app.add_option("--expert-exchange", flags.expertExchange,
                 "how expert parallelism moves tokens: all-gather (default: every token to every EP rank) | all-to-all "
                 "(dropless dispatch; docs/parallelism.md, 'Expert parallelism')")
      ->check(CLI::IsMember({"all-gather", "all-to-all"}));
  app.add_option("--fusion", flags.fusion,
                 "on (default) | off: fuse chains of elementwise ops into one step each (dg-fuse-elementwise; "
                 "docs/kernels.md, 'Fused elementwise chains')")
      ->check(CLI::IsMember({"on", "off"}));
  app.add_option("--recompute", flags.recompute,
                 "what the backward recomputes: none | full[:N] (every layer, or chunks of N, from its input) | selective "
                 "(attention core and MoE intermediates); docs/training.md, 'Recomputation'")
      ->check(CLI::Validator(
          [](std::string& text) {
            return mlir::dg::parseRecomputePolicy(text) ? std::string()
                                                        : std::string("expected ") + mlir::dg::kRecomputePolicyExpected +
                                                              ", got " + dgemma::quoteForMessage(text, 40);
          },
          "POLICY"));
  app.add_option("--backward-order", flags.backwardOrder,
                 "scheduled (default: dg-backward-schedule, docs/performance.md) | autodiff (the order autodiff wrote); "
                 "the same values either way")
      ->check(CLI::IsMember({"scheduled", "autodiff"}));
  app.add_option("--precision", flags.precision, "fp32 | bf16 (mixed: bf16 compute, f32 masters, docs/training.md, 'Mixed precision')")->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--backend", flags.backend, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}));
  app.add_option("--emit", flags.emit, "print a stage to stdout: dg | autodiff | sharded | recompute | plan-json")
      ->check(CLI::IsMember({"dg", "autodiff", "sharded", "recompute", "plan-json"}));
  app.add_flag("--report", flags.report,
               "print per-entry FLOPs; per rank the peak memory by pool, FLOPs, recompute and communication per step; "
               "the time per compiler pass");
  app.add_option("-o,--output", flags.output, "plan directory to write");
  app.add_flag("--auto-layout", flags.autoLayout,
               "search the TP/SP/EP/DP layout and recompute policy of --gpus ranks by the cost model, print the ranked "
               "table and compile the chosen one (without -o: the table only)");
  app.add_option("--gpus", flags.gpus, "--auto-layout: the number of ranks")->check(dgemma::integerIn(1, kMaxParallel));
  app.add_option("--gpu-memory", flags.gpuMemory, "--auto-layout: memory per rank, e.g. 141GiB (default: the --gpu's)");
  app.add_option("--gpu", flags.gpu, "--auto-layout: the accelerator of the cost model: " + dgemma::acceleratorNames() + " (default h200)");

  int exitCode = 0;
  if (!dgemma::parseCommandLine(app, argc, argv, exitCode)) return exitCode;
  return dgemma::runReportingErrors("dgemma-compile", [&] {
    // The plan's files must not land on the model they are compiled from (docs/cli.md, "Outputs and inputs").
    if (flags.model.rfind("builtin:", 0) != 0) dgemma::checkOutputsAgainstInputs({{"-o", flags.output}}, {{"--model", flags.model}});
    if (!flags.preset.empty()) applyPreset(app, flags.preset);
    for (const char* name : {"--tp", "--dp", "--ep", "--sp", "--recompute"})
      if (app.get_option(name)->count() > 0) flags.explicitLayoutFlags.push_back(name);
    return compile(flags);
  });
}
