// The DiffusionGemma image entries (forward_images, train_step_images) built, compiled and run
// in-process on the CPU backend against HF transformers (test/fixtures/diffusion_gemma_vision,
// produced by tools/reference/make_vision_fixtures.py): the host-derived image inputs
// (runtime/data/batch/ImageInputs) against the script's, the projected vision features, the merged
// encoder input, the encoder's final-norm output and K/V, and the logits, with the encoder's
// image-bidirectional overlay on ("vision") and off (HF's forward without mm_token_type_ids); and
// the training step's loss terms and every parameter's gradient (vision parameters included)
// against fp64 torch autograd. Bars: max|Δ| / max|ref| <= 1e-5 for the fp32 forward; loss within
// 1e-6 relative and every gradient ‖Δ‖/‖ref‖ <= 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <string>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "compiler/Transforms/RecomputePolicy.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/ir/Inference.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/data/batch/ImageInputs.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/io/Safetensors.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/comm/GlooCommunicator.h"
#include "runtime/session/GlobalTensors.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using Inputs = std::map<std::string, HostTensor>;

constexpr double kForwardTolerance = 1e-5;
constexpr double kLossTolerance = 1e-6;
constexpr double kGradientTolerance = 1e-5;

std::string fixtureDir(const std::string& name) {
  return std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma_vision/" + name;
}

// max|Δ| / max|ref| over the elements a test compares.
struct Error {
  double maxAbs = 0, maxRef = 0;
  void add(double actual, double expected) {
    maxAbs = std::max(maxAbs, std::abs(actual - expected));
    maxRef = std::max(maxRef, std::abs(expected));
  }
  double relative() const { return maxRef > 0 ? maxAbs / maxRef : maxAbs; }
};

// A plan of the fixture model compiled in-process (one entry kind), with every weight the plan
// declares loaded through the checkpoint rules (text and vision), as dgemma-run loads them.
class ImagePlan {
 public:
  ImagePlan(const DiffusionGemmaConfig& config, const std::string& modelDir, int64_t microBatch, int64_t promptLength,
            int64_t imagesPerExample, const mlir::dg::DiffusionGemmaObjective* objective,
            mlir::dg::Precision precision = mlir::dg::Precision::Fp32, int64_t cacheLength = 0,
            const std::string& recompute = "none")
      : config_(config) {
    mlir::OwningOpRef<mlir::ModuleOp> module;
    mlir::dg::PipelineOptions pipeline;
    if (objective) {
      mlir::dg::DiffusionGemmaTrainOptions options;
      options.microBatch = microBatch;
      options.promptLengths = {promptLength};
      options.objective = *objective;
      options.imagesPerExample = imagesPerExample;
      options.precision = precision;
      module = mlir::dg::buildDiffusionGemmaTrain(context_, config_, options);
      pipeline.train = true;
    } else if (cacheLength > 0) {
      mlir::dg::DiffusionGemmaInferenceOptions options;
      options.microBatch = microBatch;
      options.promptLengths = {promptLength};
      options.imagesPerExample = imagesPerExample;
      options.precision = precision;
      options.cacheLength = cacheLength;
      module = mlir::dg::buildDiffusionGemmaInference(context_, config_, options);
    } else {
      mlir::dg::DiffusionGemmaForwardOptions options;
      options.microBatch = microBatch;
      options.promptLengths = {promptLength};
      options.imagesPerExample = imagesPerExample;
      options.precision = precision;
      module = mlir::dg::buildDiffusionGemmaForward(context_, config_, options);
    }
    EXPECT_TRUE(mlir::succeeded(mlir::verify(*module)));
    pipeline.recompute = *mlir::dg::parseRecomputePolicy(recompute);
    if (objective) EXPECT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
    EXPECT_TRUE(mlir::succeeded(mlir::dg::runRecomputationStage(*module, pipeline)));
    EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
    auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
    EXPECT_TRUE(mlir::succeeded(plan));
    plan_ = std::move(*plan);
    // An inference plan carries its generation sizes (dgemma-compile --mode infer writes them).
    if (cacheLength > 0) plan_.generation = GenerationSettings{config_.canvasLength, config_.canvasLength, cacheLength};
    backend_ = createBackend("cpu", 2);
    executor_ = std::make_unique<Executor>(plan_, *backend_, communicators_, "vision-parity");
    SafetensorsDirectory checkpoint = SafetensorsDirectory::open(modelDir + "/model.safetensors");
    ResolvedCheckpoint resolved = resolveCheckpointNames(config_, checkpoint);
    EXPECT_EQ(resolved.visionTensors.size(), expectedVisionWeights(config_).size());
    loadWeights(*executor_, modelDir, [&](const std::string& name) -> std::optional<HostTensor> {
      for (const auto* tensors : {&resolved.textTensors, &resolved.visionTensors})
        if (auto found = tensors->find(name); found != tensors->end())
          return found->second.file->read(found->second.entry->name);
      return std::nullopt;
    });
  }

  // Runs the entry `entryName` on the inputs it declares.
  Inputs run(const std::string& entryName, const Inputs& inputs) {
    for (const EntryPoint& entry : plan_.entryPoints) {
      if (entry.name != entryName) continue;
      Inputs taken;
      for (const NamedBuffer& input : entry.inputs) {
        EXPECT_TRUE(inputs.count(input.name)) << "input " << input.name;
        if (inputs.count(input.name)) taken[input.name] = inputs.at(input.name);
      }
      return executor_->run(entry, taken);
    }
    ADD_FAILURE() << "no entry " << entryName;
    return {};
  }

  const Plan& plan() const { return plan_; }
  HostTensor parameter(const std::string& name) const { return executor_->parameter(name); }

 private:
  mlir::MLIRContext context_;
  DiffusionGemmaConfig config_;
  Plan plan_;
  std::unique_ptr<Backend> backend_;
  CommunicatorSet communicators_;
  std::unique_ptr<Executor> executor_;
};

Inputs readAll(const SafetensorsFile& file) {
  Inputs tensors;
  for (const SafetensorsEntry& entry : file.entries()) tensors[entry.name] = file.read(entry.name);
  return tensors;
}

// The batch's host-derived image inputs, checked equal to the fixture script's own derivation.
void addImagePlanInputs(Inputs& batch, const DiffusionGemmaConfig& config, int64_t imagesPerExample,
                        const SafetensorsFile* expected) {
  const ImagePlanInputs derived =
      deriveImagePlanInputs(batch.at("image_position_ids"), batch.at("mm_token_type_ids"), imagesPerExample,
                            config.vision.poolingKernelSize, config.maxSoftTokensPerImage);
  batch["image_pool_slot"] = derived.poolSlot;
  batch["image_token_index"] = derived.tokenIndex;
  batch["image_segment_ids"] = derived.segmentIds;
  if (!expected) return;
  for (const char* name : {"image_pool_slot", "image_token_index", "image_segment_ids"}) {
    const HostTensor reference = expected->read(name);
    EXPECT_EQ(batch.at(name).shape, reference.shape) << name;
    EXPECT_EQ(batch.at(name).data, reference.data) << name << ": differs from the fixture script's derivation";
  }
}

struct ForwardCase {
  std::string fixture;
  bool overlay;  // the config's use_bidirectional_attention "vision" (HF generate) or null (HF forward without mm ids)
};

std::ostream& operator<<(std::ostream& stream, const ForwardCase& forwardCase) {
  return stream << forwardCase.fixture << (forwardCase.overlay ? " overlay" : " causal");
}

class VisionForwardParity : public ::testing::TestWithParam<ForwardCase> {};

TEST_P(VisionForwardParity, MatchesTransformers) {
  const std::string dir = fixtureDir(GetParam().fixture);
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  ASSERT_TRUE(config.hasVision);
  ASSERT_TRUE(config.imageTokensBidirectional);
  config.imageTokensBidirectional = GetParam().overlay;
  SafetensorsFile expected = SafetensorsFile::open(dir + "/expected.safetensors");
  Inputs batch = readAll(SafetensorsFile::open(dir + "/batch.safetensors"));
  const int64_t examples = batch.at("input_ids").shape[0], promptLength = batch.at("input_ids").shape[1];
  const int64_t imagesPerExample = batch.at("pixel_values").shape[0] / examples;
  addImagePlanInputs(batch, config, imagesPerExample, &expected);

  ImagePlan plan(config, dir, examples, promptLength, imagesPerExample, nullptr);
  Inputs out = plan.run("forward_images", batch);
  if (HasFailure()) return;
  const std::string suffix = GetParam().overlay ? "" : "_causal";
  std::cout << "[ vision parity ] " << GetParam().fixture << (GetParam().overlay ? " overlay" : " causal");

  // The projected features in placeholder order: the rows image_token_index names, position by position.
  const HostTensor& features = out.at("vision_features");
  const HostTensor referenceFeatures = expected.read("vision_features");
  const HostTensor& tokenIndex = batch.at("image_token_index");
  const int64_t width = config.hiddenSize, pooledRows = features.shape[0];
  ASSERT_EQ(features.shape, (std::vector<int64_t>{pooledRows, width}));
  Error featureError;
  int64_t placeholder = 0;
  for (int64_t i = 0; i < tokenIndex.numElements(); ++i) {
    const int64_t row = tokenIndex.as<int64_t>()[i];
    if (row >= pooledRows) continue;
    ASSERT_LT(placeholder, referenceFeatures.shape[0]);
    for (int64_t h = 0; h < width; ++h)
      featureError.add(features.as<float>()[row * width + h], referenceFeatures.as<float>()[placeholder * width + h]);
    ++placeholder;
  }
  EXPECT_EQ(placeholder, referenceFeatures.shape[0]);
  EXPECT_LE(featureError.relative(), kForwardTolerance) << "vision_features";
  std::cout << ": features " << featureError.relative();

  // The merged encoder input everywhere (padding positions hold the pad embedding in both).
  Error inputError;
  const HostTensor referenceInput = expected.read("inputs_embeds");
  ASSERT_EQ(out.at("encoder_input").shape, referenceInput.shape);
  for (int64_t i = 0; i < referenceInput.numElements(); ++i)
    inputError.add(out.at("encoder_input").as<float>()[i], referenceInput.as<float>()[i]);
  EXPECT_LE(inputError.relative(), kForwardTolerance) << "encoder_input";
  std::cout << ", encoder_input " << inputError.relative();

  // The encoder's final-norm output and K/V at real prompt tokens.
  const int64_t* mask = batch.at("attention_mask").as<int64_t>();
  if (expected.find("encoder_hidden" + suffix)) {
    const HostTensor reference = expected.read("encoder_hidden" + suffix);
    ASSERT_EQ(out.at("encoder_hidden").shape, reference.shape);
    Error hiddenError;
    for (int64_t p = 0; p < examples * promptLength; ++p)
      if (mask[p])
        for (int64_t h = 0; h < width; ++h) hiddenError.add(out.at("encoder_hidden").as<float>()[p * width + h], reference.as<float>()[p * width + h]);
    EXPECT_LE(hiddenError.relative(), kForwardTolerance) << "encoder_hidden" << suffix;
    std::cout << ", encoder_hidden " << hiddenError.relative();
  }
  if (GetParam().overlay && expected.find("encoder_k_untrimmed.0")) {
    Error keyValueError;
    for (int64_t layer = 0; layer < config.numHiddenLayers; ++layer)
      for (const char* kind : {"k", "v"}) {
        const HostTensor& actual = out.at("encoder_" + std::string(kind) + "." + std::to_string(layer));
        const HostTensor reference = expected.read("encoder_" + std::string(kind) + "_untrimmed." + std::to_string(layer));
        const int64_t heads = actual.shape[2], headDim = actual.shape[3];
        ASSERT_EQ(reference.shape, (std::vector<int64_t>{examples, heads, promptLength, headDim}));
        for (int64_t b = 0; b < examples; ++b)
          for (int64_t p = 0; p < promptLength; ++p)
            if (mask[b * promptLength + p])
              for (int64_t h = 0; h < heads; ++h)
                for (int64_t d = 0; d < headDim; ++d)
                  keyValueError.add(actual.as<float>()[((b * promptLength + p) * heads + h) * headDim + d],
                                    reference.as<float>()[((b * heads + h) * promptLength + p) * headDim + d]);
      }
    EXPECT_LE(keyValueError.relative(), kForwardTolerance) << "encoder K/V";
    std::cout << ", K/V " << keyValueError.relative();
  }

  const HostTensor referenceLogits = expected.read("logits" + suffix);
  ASSERT_EQ(out.at("logits").shape, referenceLogits.shape);
  Error logitsError;
  for (int64_t i = 0; i < referenceLogits.numElements(); ++i)
    logitsError.add(out.at("logits").as<float>()[i], referenceLogits.as<float>()[i]);
  EXPECT_LE(logitsError.relative(), kForwardTolerance) << "logits" << suffix;
  std::cout << ", logits " << logitsError.relative() << "\n";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, VisionForwardParity,
                         ::testing::Values(ForwardCase{"one_image", true}, ForwardCase{"one_image", false},
                                           ForwardCase{"two_images", true}, ForwardCase{"two_images", false}),
                         [](const ::testing::TestParamInfo<ForwardCase>& info) {
                           return info.param.fixture + (info.param.overlay ? "_overlay" : "_causal");
                         });

// A bf16 mixed-precision image plan (no HF bf16 reference exists for the vision fixtures): it runs,
// rounds (its features differ from HF's fp32 ones by more than fp32 noise) and stays within a few
// bf16 ulps' worth of the fp32 reference through the two vision layers and the projector.
TEST(VisionBf16, FeaturesRoundLikeBf16) {
  const std::string dir = fixtureDir("one_image");
  DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  config.imageTokensBidirectional = false;
  SafetensorsFile expected = SafetensorsFile::open(dir + "/expected.safetensors");
  Inputs batch = readAll(SafetensorsFile::open(dir + "/batch.safetensors"));
  addImagePlanInputs(batch, config, 1, nullptr);
  ImagePlan plan(config, dir, 2, 72, 1, nullptr, mlir::dg::Precision::Bf16);
  Inputs out = plan.run("forward_images", batch);
  if (HasFailure()) return;
  const HostTensor& features = out.at("vision_features");
  const HostTensor reference = expected.read("vision_features");
  const int64_t width = config.hiddenSize;
  Error error;
  int64_t placeholder = 0;
  for (int64_t i = 0; i < batch.at("image_token_index").numElements(); ++i) {
    const int64_t row = batch.at("image_token_index").as<int64_t>()[i];
    if (row >= features.shape[0]) continue;
    for (int64_t h = 0; h < width; ++h) error.add(features.as<float>()[row * width + h], reference.as<float>()[placeholder * width + h]);
    ++placeholder;
  }
  std::cout << "[ vision bf16 ] features " << error.relative() << "\n";
  EXPECT_GT(error.relative(), 1e-4);
  EXPECT_LE(error.relative(), 5e-2);
  for (float value : std::vector<float>(out.at("logits").as<float>(), out.at("logits").as<float>() + out.at("logits").numElements()))
    ASSERT_TRUE(std::isfinite(value));
}

// prefill_images writes the cache the decoder reads: with C = P, every full layer's cache is the
// prompt's K/V and a sliding layer's the last W - 1 positions, against HF's overlay-on K/V.
TEST(VisionPrefillParity, CacheHoldsTheImagePromptsKeyValues) {
  const std::string dir = fixtureDir("one_image");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  SafetensorsFile expected = SafetensorsFile::open(dir + "/expected.safetensors");
  Inputs batch = readAll(SafetensorsFile::open(dir + "/batch.safetensors"));
  const int64_t examples = batch.at("input_ids").shape[0], promptLength = batch.at("input_ids").shape[1];
  addImagePlanInputs(batch, config, 1, nullptr);
  batch["positions"] = batch.at("position_ids");
  batch["write_rows"] = HostTensor(DType::F32, {examples});
  std::fill_n(batch.at("write_rows").as<float>(), examples, 1.0f);
  ImagePlan plan(config, dir, examples, promptLength, 1, nullptr, mlir::dg::Precision::Fp32, promptLength);
  plan.run("prefill_images", batch);
  if (HasFailure()) return;
  const int64_t* mask = batch.at("attention_mask").as<int64_t>();
  Error error;
  for (int64_t layer = 0; layer < config.numHiddenLayers; ++layer)
    for (const char* kind : {"k", "v"}) {
      const HostTensor cache = plan.parameter((kind == std::string("k") ? mlir::dg::cacheKeysName(layer) : mlir::dg::cacheValuesName(layer)));
      const HostTensor reference = expected.read("encoder_" + std::string(kind) + "_untrimmed." + std::to_string(layer));
      const int64_t slots = cache.shape[1], heads = cache.shape[2], headDim = cache.shape[3];
      ASSERT_EQ(slots, mlir::dg::layerCacheLength(config, layer, promptLength));
      for (int64_t b = 0; b < examples; ++b)
        for (int64_t s = 0; s < slots; ++s) {
          const int64_t p = promptLength - slots + s;
          if (!mask[b * promptLength + p]) continue;
          for (int64_t h = 0; h < heads; ++h)
            for (int64_t d = 0; d < headDim; ++d)
              error.add(cache.as<float>()[((b * slots + s) * heads + h) * headDim + d],
                        reference.as<float>()[((b * heads + h) * promptLength + p) * headDim + d]);
        }
    }
  std::cout << "[ vision prefill ] cache " << error.relative() << "\n";
  EXPECT_LE(error.relative(), kForwardTolerance);
}

double norm(const HostTensor& tensor) {
  double sum = 0;
  for (int64_t i = 0; i < tensor.numElements(); ++i) sum += double(tensor.as<float>()[i]) * tensor.as<float>()[i];
  return std::sqrt(sum);
}

// reweighted-loo-ce with self-conditioning (the fixture injects its mask [1, 0]) and the encoder
// loss: every encoder pass runs over the merged prompt with the overlay; the vision parameters get
// the K/V pass's and the clean pass's gradient.
class VisionTrainParity : public ::testing::TestWithParam<std::string> {};

TEST_P(VisionTrainParity, MatchesTorchAutograd) {
  const std::string dir = fixtureDir("train_one_image");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  SafetensorsFile expected = SafetensorsFile::open(dir + "/reweighted-loo-ce.sc1.enc1.safetensors");
  Inputs batch = readAll(SafetensorsFile::open(dir + "/batch.safetensors"));
  const int64_t examples = batch.at("input_ids").shape[0], promptLength = batch.at("input_ids").shape[1];
  const int64_t imagesPerExample = batch.at("pixel_values").shape[0] / examples;
  addImagePlanInputs(batch, config, imagesPerExample, nullptr);

  mlir::dg::DiffusionGemmaObjective objective;
  objective.variant = mlir::dg::DiffusionGemmaObjective::Variant::ReweightedLooCe;
  objective.selfConditioningProb = 0.5;
  objective.encoderLossWeight = 1.0;
  ImagePlan plan(config, dir, examples, promptLength, imagesPerExample, &objective, mlir::dg::Precision::Fp32, 0, GetParam());
  Inputs out = plan.run("train_step_images", batch);
  if (HasFailure()) return;

  std::cout << "[ vision train parity ] recompute " << GetParam() << ":";
  for (const char* name : {"loss", "diffusion_loss", "encoder_loss"}) {
    const double reference = convertDType(expected.read(name), DType::F64, name).as<double>()[0];
    const double actual = out.at(name).as<float>()[0];
    EXPECT_LE(std::abs(actual - reference) / std::abs(reference), kLossTolerance) << name;
    std::cout << " " << name << " " << std::abs(actual - reference) / std::abs(reference);
  }
  const std::string gradientPrefix = "grad/";
  std::set<std::string> expectedNames, writtenNames;
  for (const SafetensorsEntry& entry : expected.entries())
    if (entry.name.rfind(gradientPrefix, 0) == 0) expectedNames.insert(entry.name);
  for (const auto& [name, tensor] : out)
    if (name.rfind(gradientPrefix, 0) == 0) writtenNames.insert(name);
  EXPECT_EQ(writtenNames, expectedNames);
  double worst = 0;
  std::string worstName;
  int64_t visionGradients = 0;
  for (const std::string& name : expectedNames) {
    if (!out.count(name)) continue;
    const HostTensor reference = expected.read(name);
    const HostTensor& actual = out.at(name);
    ASSERT_EQ(actual.shape, reference.shape) << name;
    HostTensor difference(DType::F32, reference.shape);
    for (int64_t i = 0; i < reference.numElements(); ++i) difference.as<float>()[i] = actual.as<float>()[i] - reference.as<float>()[i];
    const double scale = norm(reference), error = scale > 0 ? norm(difference) / scale : norm(difference);
    EXPECT_LE(error, kGradientTolerance) << name;
    EXPECT_GT(scale, 0) << name << ": the reference gradient is zero";
    visionGradients += name.find("vision") != std::string::npos;
    if (error > worst) worst = error, worstName = name;
  }
  EXPECT_GT(visionGradients, 0);
  std::cout << " worst gradient " << worst << " (" << worstName << ")\n";
}

// The text layers are marked for dg-recompute; the vision layers are not, so their activations stay
// live and the gradients are the same under every policy.
INSTANTIATE_TEST_SUITE_P(Recompute, VisionTrainParity, ::testing::Values("none", "full", "selective"));

// Image plans compile under every parallel layout (docs/parallelism.md): the vision tower's
// parameters are replicated (whole on every rank), whatever the text stack's split.
struct Layout {
  std::string name;
  mlir::dg::ShardingOptions options;
};

std::ostream& operator<<(std::ostream& stream, const Layout& layout) { return stream << layout.name; }

class VisionShardedCompile : public ::testing::TestWithParam<Layout> {};

TEST_P(VisionShardedCompile, EveryRankPlansTheImageEntries) {
  const std::string dir = fixtureDir("train_one_image");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  const mlir::dg::ShardingOptions& layout = GetParam().options;
  for (const bool train : {true, false}) {
    SCOPED_TRACE(train ? "train" : "infer");
    mlir::MLIRContext context;
    mlir::OwningOpRef<mlir::ModuleOp> module;
    mlir::dg::PipelineOptions pipeline;
    pipeline.train = train;
    if (train) {
      mlir::dg::DiffusionGemmaTrainOptions options;
      options.microBatch = 2;
      options.promptLengths = {72};
      options.objective.selfConditioningProb = 0.5;
      options.imagesPerExample = 1;
      module = mlir::dg::buildDiffusionGemmaTrain(context, config, options);
    } else {
      mlir::dg::DiffusionGemmaInferenceOptions options;
      options.microBatch = 2;
      options.promptLengths = {72};
      options.cacheLength = mlir::dg::inferenceCacheLength(72, 32, config.canvasLength);
      options.imagesPerExample = 1;
      module = mlir::dg::buildDiffusionGemmaInference(context, config, options);
    }
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runShardingStage(*module, layout)));
    for (int64_t rank = 0; rank < layout.worldSize(); ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      auto partition = mlir::dg::partitionForRank(*module, rank, layout);
      ASSERT_TRUE(mlir::succeeded(partition));
      ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(**partition, pipeline)));
      mlir::dg::PlanLoweringOptions lowering;
      lowering.rank = rank;
      auto plan = mlir::dg::lowerToPlan(**partition, lowering);
      ASSERT_TRUE(mlir::succeeded(plan));
      std::set<std::string> entries;
      for (const EntryPoint& entry : plan->entryPoints) entries.insert(entry.name);
      for (const char* name : train ? std::vector<const char*>{"train_step", "train_step_images"}
                                    : std::vector<const char*>{"forward_images", "prefill", "prefill_images"})
        EXPECT_TRUE(entries.count(name)) << name;
      int64_t visionParameters = 0;
      for (const Parameter& parameter : plan->parameters) {
        if (parameter.name.find("vision") == std::string::npos || parameter.name.rfind("grad/", 0) == 0) continue;
        ++visionParameters;
        EXPECT_EQ(parameter.shardShape, parameter.globalShape) << parameter.name << ": not replicated";
      }
      EXPECT_EQ(visionParameters, static_cast<int64_t>(expectedVisionWeights(config).size()));
    }
  }
}

mlir::dg::ShardingOptions layoutOf(int64_t tensorParallel, int64_t dataParallel, int64_t expertParallel, bool sequenceParallel) {
  mlir::dg::ShardingOptions options;
  options.tensorParallel = tensorParallel;
  options.dataParallel = dataParallel;
  options.expertParallel = expertParallel;
  options.sequenceParallel = sequenceParallel;
  return options;
}

// tp4: 2 KV heads on 4 ranks (docs/parallelism.md, "Tensor parallelism beyond the KV heads").
INSTANTIATE_TEST_SUITE_P(
    Layouts, VisionShardedCompile,
    ::testing::Values(Layout{"tp2", layoutOf(2, 1, 1, false)}, Layout{"tp2_sp", layoutOf(2, 1, 1, true)},
                      Layout{"dp2", layoutOf(1, 2, 1, false)}, Layout{"dp2_ep2", layoutOf(1, 2, 2, false)},
                      Layout{"tp4", layoutOf(4, 1, 1, false)}, Layout{"tp4_sp", layoutOf(4, 1, 1, true)}),
    [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

// The image training step on two ranks (Gloo threads) under one-axis layouts: tensor parallel
// (every rank runs the whole vision tower on the whole micro-batch) and data parallel (each rank its
// example and its images), against the same fp64 reference. The vision parameters are whole on
// every rank, and so is each rank's (reduced) gradient output.
// The fixture's image training step (reweighted-loo-ce, self-conditioning, the encoder loss) under
// a one-axis layout: its per-rank plans, each run on a Gloo thread of this process; every rank's outputs.
std::vector<Inputs> runImageTrainStepOnRanks(const mlir::dg::ShardingOptions& layout, const Inputs& batch) {
  // The ranks share this process, and OpenBLAS's thread count is one setting for it: the MoE and
  // attention kernels set it to 1 while they run (SingleThreadedProducts), which would turn the other
  // rank's concurrent products from 2-thread to 1-thread rounding, so the ranks' gradients could
  // differ. OpenBLAS is pinned to one thread instead, as dgemma-run does.
  threadProductsOnPool();
  const std::string dir = fixtureDir("train_one_image");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  const int64_t ranks = layout.worldSize();

  mlir::MLIRContext context;
  mlir::dg::DiffusionGemmaTrainOptions options;
  options.microBatch = 2;
  options.promptLengths = {72};
  options.objective.variant = mlir::dg::DiffusionGemmaObjective::Variant::ReweightedLooCe;
  options.objective.selfConditioningProb = 0.5;
  options.objective.encoderLossWeight = 1.0;
  options.imagesPerExample = 1;
  auto module = mlir::dg::buildDiffusionGemmaTrain(context, config, options);
  mlir::dg::PipelineOptions pipeline;
  pipeline.train = true;
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
  EXPECT_TRUE(mlir::succeeded(mlir::dg::runShardingStage(*module, layout)));
  std::vector<Plan> plans;
  for (int64_t rank = 0; rank < ranks; ++rank) {
    auto partition = mlir::dg::partitionForRank(*module, rank, layout);
    EXPECT_TRUE(mlir::succeeded(partition));
    if (mlir::failed(partition)) return {};
    EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(**partition, pipeline)));
    mlir::dg::PlanLoweringOptions lowering;
    lowering.rank = rank;
    auto plan = mlir::dg::lowerToPlan(**partition, lowering);
    EXPECT_TRUE(mlir::succeeded(plan));
    if (mlir::failed(plan)) return {};
    plans.push_back(std::move(*plan));
  }

  SafetensorsDirectory checkpoint = SafetensorsDirectory::open(dir + "/model.safetensors");
  const ResolvedCheckpoint resolved = resolveCheckpointNames(config, checkpoint);
  std::vector<Inputs> outputs(ranks);
  const std::vector<std::string> failures =
      test::runOnRanks(ranks, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>& store) {
        const Plan& plan = plans[rank];
        std::unique_ptr<Backend> backend = createBackend("cpu", 1);
        CommunicatorSet communicators;
        for (const MeshAxis& axis : plan.mesh)  // one axis: its group is every rank
          communicators.add(axis.name, createGlooCommunicator(store, rank, ranks, std::chrono::seconds(60)));
        Executor executor(plan, *backend, communicators, "vision-ranks");
        loadWeights(executor, dir, [&](const std::string& name) -> std::optional<HostTensor> {
          for (const auto* tensors : {&resolved.textTensors, &resolved.visionTensors})
            if (auto found = tensors->find(name); found != tensors->end())
              return found->second.file->read(found->second.entry->name);
          return std::nullopt;
        });
        const EntryPoint* entry = plan.selectEntry("train_step_images", {});
        if (!entry) throw std::runtime_error("no train_step_images entry");
        Inputs taken;
        for (const NamedBuffer& input : entry->inputs) {
          const HostTensor& global = batch.at(input.name);
          taken[input.name] =
              input.isWhole() ? global : cutBox(global, input.globalShape, boxOf(input, plan), input.name);
        }
        outputs[rank] = executor.run(*entry, taken);
      });
  for (int64_t rank = 0; rank < ranks; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
  return outputs;
}

// The image training step on two ranks (Gloo threads) under one-axis layouts: tensor parallel
// (every rank runs the whole vision tower on the whole micro-batch) and data parallel (each rank its
// example and its images), against the same fp64 reference. The vision parameters are whole on
// every rank, and so is each rank's (reduced) gradient output.
class VisionTrainTwoRanks : public ::testing::TestWithParam<Layout> {};

TEST_P(VisionTrainTwoRanks, MatchesTorchAutograd) {
  const std::string dir = fixtureDir("train_one_image");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  SafetensorsFile expected = SafetensorsFile::open(dir + "/reweighted-loo-ce.sc1.enc1.safetensors");
  Inputs batch = readAll(SafetensorsFile::open(dir + "/batch.safetensors"));
  addImagePlanInputs(batch, config, 1, nullptr);
  const mlir::dg::ShardingOptions& layout = GetParam().options;
  ASSERT_EQ(layout.worldSize(), 2);
  const std::vector<Inputs> outputs = runImageTrainStepOnRanks(layout, batch);
  if (HasFailure()) return;
  std::vector<std::map<std::string, HostTensor>> gradients(2);
  for (int64_t rank = 0; rank < 2; ++rank)
    for (const auto& [name, tensor] : outputs[rank])
      if (name.rfind("grad/", 0) == 0 && name.find("vision") != std::string::npos) gradients[rank][name] = tensor;

  const double referenceLoss = convertDType(expected.read("loss"), DType::F64, "loss").as<double>()[0];
  const double loss = outputs[0].at("loss").as<float>()[0];
  EXPECT_LE(std::abs(loss - referenceLoss) / std::abs(referenceLoss), kLossTolerance) << "loss";
  std::cout << "[ vision two ranks ] " << GetParam().name << ": loss " << std::abs(loss - referenceLoss) / std::abs(referenceLoss);
  ASSERT_EQ(gradients[0].size(), 29u);  // every trainable vision parameter (the two std buffers have none)
  double worst = 0;
  for (const auto& [name, rankZero] : gradients[0]) {
    // A whole gradient output, already reduced over the ranks: both ranks hold the same one.
    const HostTensor& gradient = rankZero;
    EXPECT_EQ(gradient.data, gradients[1].at(name).data) << name << ": the ranks' gradients differ";
    const HostTensor reference = expected.read(name);
    ASSERT_EQ(gradient.shape, reference.shape) << name;
    HostTensor difference(DType::F32, reference.shape);
    for (int64_t i = 0; i < reference.numElements(); ++i)
      difference.as<float>()[i] = gradient.as<float>()[i] - reference.as<float>()[i];
    const double error = norm(difference) / norm(reference);
    EXPECT_LE(error, kGradientTolerance) << name;
    worst = std::max(worst, error);
  }
  std::cout << ", worst vision gradient " << worst << "\n";
}

// ||got - want|| / ||want|| (L2; the absolute distance for a zero tensor).
double relativeDistance(const HostTensor& got, const HostTensor& want) {
  double difference = 0, scale = 0;
  for (int64_t i = 0; i < want.numElements(); ++i) {
    const double delta = double(got.as<float>()[i]) - double(want.as<float>()[i]);
    difference += delta * delta;
    scale += double(want.as<float>()[i]) * want.as<float>()[i];
  }
  return scale > 0 ? std::sqrt(difference / scale) : std::sqrt(difference);
}

// Context parallelism with images (docs/parallelism.md, "Context parallelism"): the fixture's image
// runs (prompt positions 5..69 and 10..65 of 72) straddle every chunk boundary of both encoder passes
// (chunks of 18 tokens in the prompt pass, 22 in the clean pass of 72 + 16 at CP 2), and the overlay
// lets a query see keys of its image past its chunk, which each chunk's attention reaches through
// trailing_keys. Every output of the CP 2 step (the loss terms and every gradient, the vision
// tower's included) equals the one-rank plan's: loss terms to 1e-6, gradients to 1e-5.
TEST(VisionContextParallel, EqualsOneRank) {
  const std::string dir = fixtureDir("train_one_image");
  const DiffusionGemmaConfig config = loadDiffusionGemmaConfig(dir + "/config.json");
  Inputs batch = readAll(SafetensorsFile::open(dir + "/batch.safetensors"));
  addImagePlanInputs(batch, config, 1, nullptr);
  mlir::dg::ShardingOptions layout;
  layout.contextParallel = 2;
  const std::vector<Inputs> outputs = runImageTrainStepOnRanks(layout, batch);
  if (HasFailure()) return;

  mlir::dg::DiffusionGemmaObjective objective;
  objective.variant = mlir::dg::DiffusionGemmaObjective::Variant::ReweightedLooCe;
  objective.selfConditioningProb = 0.5;
  objective.encoderLossWeight = 1.0;
  ImagePlan one(config, dir, 2, 72, 1, &objective);
  const Inputs want = one.run("train_step_images", batch);
  if (HasFailure()) return;
  int64_t gradients = 0, visionGradients = 0;
  double worst = 0;
  std::string worstName;
  for (const auto& [name, reference] : want) {
    ASSERT_TRUE(outputs[0].count(name)) << name << ": missing from the context-parallel step";
    const HostTensor& got = outputs[0].at(name);
    ASSERT_EQ(got.shape, reference.shape) << name;
    const bool gradient = name.rfind("grad/", 0) == 0;
    const double error = relativeDistance(got, reference);
    EXPECT_LE(error, gradient ? kGradientTolerance : kLossTolerance) << name;
    gradients += gradient;
    visionGradients += gradient && name.find("vision") != std::string::npos;
    if (gradient && error > worst) worst = error, worstName = name;
  }
  EXPECT_EQ(visionGradients, 29);  // every trainable vision parameter
  EXPECT_GT(gradients, visionGradients);
  std::cout << "[ vision cp2 ] " << gradients << " gradients, worst " << worst << " (" << worstName << ")\n";
}

INSTANTIATE_TEST_SUITE_P(Layouts, VisionTrainTwoRanks,
                         ::testing::Values(Layout{"tp2", layoutOf(2, 1, 1, false)}, Layout{"dp2", layoutOf(1, 2, 1, false)}),
                         [](const ::testing::TestParamInfo<Layout>& info) { return info.param.name; });

}  // namespace
}  // namespace dgemma
