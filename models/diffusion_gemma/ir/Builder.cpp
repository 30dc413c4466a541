// The public entry points (Builder.h): each prompt-length bucket's function, filled by the parts
// of the model: GraphBuilder.h (the shared op helpers), TextStack.h (the text model) and
// Objective.h (corruption and the training objective).
#include "models/diffusion_gemma/ir/Builder.h"

#include "models/diffusion_gemma/ir/GraphBuilder.h"
#include "models/diffusion_gemma/ir/Objective.h"
#include "models/diffusion_gemma/ir/Pretraining.h"
#include "models/diffusion_gemma/ir/TextStack.h"
#include "models/diffusion_gemma/ir/VisionTower.h"
#include "models/diffusion_gemma/spec/Interface.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "support/Error.h"

namespace mlir::dg {

using namespace ::dgemma::diffusion_gemma;

namespace {

using dgemma::DiffusionGemmaConfig;
using diffusion_gemma::addEntryFunction;
using diffusion_gemma::createDiffusionGemmaModule;
using diffusion_gemma::GraphBuilder;
using diffusion_gemma::LayerKeyValues;
using diffusion_gemma::ObjectiveBuilder;
using diffusion_gemma::PretrainingBuilder;
using diffusion_gemma::TextStack;
using diffusion_gemma::VisionTower;

// The body of a "forward" entry (Builder.h): the encoder, then one decoder step; with images
// (imagesPerExample >= 1, "forward_images") the encoder reads the prompt merged with the vision
// features.
void buildForward(GraphBuilder& g, TextStack& text, int64_t promptLength, int64_t imagesPerExample) {
  const DiffusionGemmaConfig& config = g.config();
  OpBuilder& b = g.builder();
  const int64_t batch = g.batch(), canvasLength = config.canvasLength;
  Value inputIds = g.input(kInputIds, {batch, promptLength}, b.getI64Type());
  Value attentionMask = g.input(kAttentionMask, {batch, promptLength}, b.getI64Type());
  Value canvasIds = g.input(kNoisyCanvasIds, {batch, canvasLength}, b.getI64Type());
  Value selfConditioningLogits = g.input(kSelfConditioningLogits, {batch, canvasLength, config.vocabSize}, g.f32());
  Value selfConditioningMask = g.input(kSelfConditioningMask, {batch}, g.f32());

  Value promptValid = g.castTo(attentionMask, b.getI1Type(), "attention_mask");
  Value positions = g.positions(0, promptLength);
  std::vector<LayerKeyValues> keyValues;
  Value hidden;
  if (imagesPerExample > 0) {
    VisionTower vision(g, imagesPerExample);
    const diffusion_gemma::ImageInputs images = vision.declareInputs(promptLength);
    Value features = vision.features(images);
    Value merged = vision.mergedEmbedding(text, inputIds, features, images.tokenIndex);
    g.output(kVisionFeatures, g.toF32(features, "vision_features"));
    g.output(kEncoderInput, g.toF32(merged, "encoder_input"));
    hidden = text.encoderStackOverEmbeddings(merged, promptValid, positions, &keyValues,
                                             vision.overlaySegmentIds(images.segmentIds));
  } else {
    hidden = text.encoderStack(inputIds, promptValid, positions, &keyValues);
  }
  g.output(
      kEncoderHidden,
      g.toF32(g.rmsNorm(hidden, g.param(TextStack::top("norm.weight"), {config.hiddenSize}, "ones"), "encoder.norm"),
              "encoder_hidden"));
  for (int64_t layer = 0; layer < config.numHiddenLayers; ++layer) {
    const std::string keyName = "encoder_k." + std::to_string(layer), valueName = "encoder_v." + std::to_string(layer);
    g.output(keyName, g.toF32(keyValues[layer].keys, keyName));
    g.output(valueName, g.toF32(keyValues[layer].values, valueName));
  }
  Value signal = text.selfConditioningSignal(selfConditioningLogits, selfConditioningMask);
  g.output(kLogits, text.decoderLogits(text.decoderInput(canvasIds, signal), promptValid, keyValues));
}

}  // namespace

void checkImagesPerExample(const DiffusionGemmaConfig& config, int64_t imagesPerExample) {
  if (imagesPerExample < 0)
    throw dgemma::InputError("images per example: expected an integer >= 0, got " + std::to_string(imagesPerExample));
  if (imagesPerExample > 0 && !config.hasVision)
    throw dgemma::InputError("images per example " + std::to_string(imagesPerExample) +
                             ": the model config has no vision_config, so it cannot read images");
}

std::optional<Precision> parsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  return std::nullopt;
}

const char* precisionName(Precision precision) { return precision == Precision::Bf16 ? "bf16" : "fp32"; }

std::optional<DiffusionGemmaObjective::Variant> parseObjectiveVariant(const std::string& name) {
  using Variant = DiffusionGemmaObjective::Variant;
  if (name == "base-sft") return Variant::BaseSft;
  if (name == "reweighted-ce") return Variant::ReweightedCe;
  if (name == "loo-ce") return Variant::LooCe;
  if (name == "reweighted-loo-ce" || name == "loo-reweighted-ce") return Variant::ReweightedLooCe;
  return std::nullopt;
}

const char* objectiveVariantName(DiffusionGemmaObjective::Variant variant) {
  switch (variant) {
    case DiffusionGemmaObjective::Variant::BaseSft: return "base-sft";
    case DiffusionGemmaObjective::Variant::ReweightedCe: return "reweighted-ce";
    case DiffusionGemmaObjective::Variant::LooCe: return "loo-ce";
    case DiffusionGemmaObjective::Variant::ReweightedLooCe: return "reweighted-loo-ce";
  }
  return "unknown";
}

std::optional<DiffusionGemmaPretrainingObjective::Kind> parsePretrainingObjective(const std::string& name) {
  using Kind = DiffusionGemmaPretrainingObjective::Kind;
  if (name == "autoregressive") return Kind::Autoregressive;
  if (name == "masked-diffusion") return Kind::MaskedDiffusion;
  if (name == "block-diffusion") return Kind::BlockDiffusion;
  return std::nullopt;
}

const char* pretrainingObjectiveName(DiffusionGemmaPretrainingObjective::Kind kind) {
  switch (kind) {
    case DiffusionGemmaPretrainingObjective::Kind::Autoregressive: return "autoregressive";
    case DiffusionGemmaPretrainingObjective::Kind::MaskedDiffusion: return "masked-diffusion";
    case DiffusionGemmaPretrainingObjective::Kind::BlockDiffusion: return "block-diffusion";
  }
  return "unknown";
}

OwningOpRef<ModuleOp> buildDiffusionGemmaForward(MLIRContext& context, const DiffusionGemmaConfig& config,
                                                 const DiffusionGemmaForwardOptions& options) {
  checkImagesPerExample(config, options.imagesPerExample);
  OwningOpRef<ModuleOp> module = createDiffusionGemmaModule(context);
  OpBuilder builder(&context);
  for (int64_t promptLength : options.promptLengths) {
    const std::vector<std::pair<StringRef, int64_t>> bucket{{kMicroBatchDimension, options.microBatch},
                                                            {kPromptLengthDimension, promptLength},
                                                            {kCanvasLengthDimension, config.canvasLength}};
    auto body = [&, promptLength](int64_t imagesPerExample) {
      return [&, promptLength, imagesPerExample] {
        GraphBuilder graph(builder, config, options.microBatch, options.precision);
        TextStack text(graph);
        buildForward(graph, text, promptLength, imagesPerExample);
      };
    };
    addEntryFunction(builder, *module, std::string(kForwardEntry) + "_p" + std::to_string(promptLength), kForwardEntry,
                     bucket, body(0));
    if (options.imagesPerExample > 0)
      addEntryFunction(builder, *module, std::string(kForwardImagesEntry) + "_p" + std::to_string(promptLength),
                       kForwardImagesEntry, diffusion_gemma::imageTwinBucket(bucket, config, options.imagesPerExample),
                       body(options.imagesPerExample));
  }
  return module;
}

OwningOpRef<ModuleOp> buildDiffusionGemmaTrain(MLIRContext& context, const DiffusionGemmaConfig& config,
                                               const DiffusionGemmaTrainOptions& options) {
  checkImagesPerExample(config, options.imagesPerExample);
  OwningOpRef<ModuleOp> module = createDiffusionGemmaModule(context);
  OpBuilder builder(&context);
  addEntryFunction(builder, *module, kCorruptEntry, kCorruptEntry,
                   {{kMicroBatchDimension, options.microBatch}, {kCanvasLengthDimension, config.canvasLength}}, [&] {
                     GraphBuilder graph(builder, config, options.microBatch, options.precision);
                     TextStack text(graph);
                     ObjectiveBuilder(graph, text, options.objective).buildCorrupt();
                   });
  for (int64_t promptLength : options.promptLengths) {
    const std::vector<std::pair<StringRef, int64_t>> bucket{{kMicroBatchDimension, options.microBatch},
                                                            {kPromptLengthDimension, promptLength},
                                                            {kCanvasLengthDimension, config.canvasLength}};
    auto body = [&, promptLength](int64_t imagesPerExample, bool logpsOnly) {
      return [&, promptLength, imagesPerExample, logpsOnly] {
        GraphBuilder graph(builder, config, options.microBatch, options.precision);
        TextStack text(graph);
        text.setSequenceMajorExpertTokens(options.sequenceMajorExpertTokens);
        ObjectiveBuilder objective(graph, text, options.objective);
        if (logpsOnly) objective.buildLogps(promptLength, imagesPerExample);
        else objective.buildTrainStep(promptLength, imagesPerExample);
      };
    };
    // A GRPO plan adds the estimate alone (docs/rl.md): "logps" beside each "train_step".
    const bool grpo = options.objective.policyLoss == DiffusionGemmaObjective::PolicyLoss::Grpo;
    for (bool logpsOnly : {false, true}) {
      if (logpsOnly && !grpo) continue;
      const std::string entry = logpsOnly ? kLogpsEntry : kTrainStepEntry;
      const std::string imageEntry = logpsOnly ? kLogpsImagesEntry : kTrainStepImagesEntry;
      addEntryFunction(builder, *module, entry + "_p" + std::to_string(promptLength), entry, bucket,
                       body(0, logpsOnly));
      if (options.imagesPerExample > 0)
        addEntryFunction(builder, *module, imageEntry + "_p" + std::to_string(promptLength), imageEntry,
                         diffusion_gemma::imageTwinBucket(bucket, config, options.imagesPerExample),
                         body(options.imagesPerExample, logpsOnly));
    }
  }
  return module;
}

namespace {

// Builds one entry per packed length, named `entry` ("<entry>_s<S>"), after checking the objective.
OwningOpRef<ModuleOp> buildPretrainingEntries(MLIRContext& context, const DiffusionGemmaConfig& config,
                                              const DiffusionGemmaPretrainingOptions& options, const char* entry,
                                              bool logitsOnly) {
  const DiffusionGemmaPretrainingObjective& objective = options.objective;
  if (objective.kind == DiffusionGemmaPretrainingObjective::Kind::MaskedDiffusion) {
    if (objective.maskTokenId < 0 || objective.maskTokenId >= config.vocabSize)
      throw dgemma::InputError("mask token id: expected an integer in [0, " + std::to_string(config.vocabSize) +
                               ") (vocab_size), got " + std::to_string(objective.maskTokenId));
    if (!(objective.maskEpsilon > 0 && objective.maskEpsilon < 1))
      throw dgemma::InputError("mask epsilon: expected a number in (0, 1), got " +
                               std::to_string(objective.maskEpsilon));
  }
  const bool blockDiffusion = objective.kind == DiffusionGemmaPretrainingObjective::Kind::BlockDiffusion;
  if (blockDiffusion) {
    if (objective.canvasLength < 1)
      throw dgemma::InputError("canvas length: expected an integer >= 1, got " +
                               std::to_string(objective.canvasLength));
    for (int64_t sequenceLength : options.sequenceLengths)
      if (sequenceLength % objective.canvasLength != 0)
        throw dgemma::InputError("sequence length " + std::to_string(sequenceLength) +
                                 ": expected a multiple of the canvas length " +
                                 std::to_string(objective.canvasLength) + " (the row is cut into whole blocks)");
    if (!(0 <= objective.noiseMin && objective.noiseMin <= objective.noiseMax && objective.noiseMax <= 1))
      throw dgemma::InputError("noise range: expected 0 <= noise_min <= noise_max <= 1");
  }
  OwningOpRef<ModuleOp> module = createDiffusionGemmaModule(context);
  OpBuilder builder(&context);
  for (int64_t sequenceLength : options.sequenceLengths) {
    std::vector<std::pair<StringRef, int64_t>> bucket{{kMicroBatchDimension, options.microBatch},
                                                      {kSequenceLengthDimension, sequenceLength}};
    // The block length is part of the step's contract (the trainer tells the objective by it).
    if (blockDiffusion) bucket.push_back({kCanvasLengthDimension, objective.canvasLength});
    addEntryFunction(builder, *module, std::string(entry) + "_s" + std::to_string(sequenceLength), entry, bucket, [&] {
      GraphBuilder graph(builder, config, options.microBatch, options.precision);
      TextStack text(graph);
      PretrainingBuilder pretraining(graph, text, objective);
      if (logitsOnly) pretraining.buildLogits(sequenceLength);
      else pretraining.buildTrainStep(sequenceLength);
    });
  }
  return module;
}

}  // namespace

OwningOpRef<ModuleOp> buildDiffusionGemmaPretrain(MLIRContext& context, const DiffusionGemmaConfig& config,
                                                  const DiffusionGemmaPretrainingOptions& options) {
  return buildPretrainingEntries(context, config, options, kTrainStepEntry, /*logitsOnly=*/false);
}

OwningOpRef<ModuleOp> buildDiffusionGemmaPretrainLogits(MLIRContext& context, const DiffusionGemmaConfig& config,
                                                        const DiffusionGemmaPretrainingOptions& options) {
  return buildPretrainingEntries(context, config, options, kPackedLogitsEntry, /*logitsOnly=*/true);
}

}  // namespace mlir::dg
