// The DiffusionGemma training step built as IR, compiled and run in-process on the CPU backend with
// the all_experts fixture model: the corruption entry's per-sample noise (docs/training.md, "Uniform-state corruption", "Noise keys") and
// the objective's unit-test anchors (docs/training.md, "The four objectives"). Gradient parity with torch lives in the integration tests.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "models/diffusion_gemma/ir/Builder.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/kernel_api/Backend.h"
#include "runtime/core/NoiseKeys.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {
namespace {

using mlir::dg::DiffusionGemmaObjective;
using mlir::dg::DiffusionGemmaTrainOptions;
using Inputs = std::map<std::string, HostTensor>;

const std::string kFixture = std::string(DGEMMA_SOURCE_DIR) + "/test/fixtures/diffusion_gemma/all_experts";

// A train plan of the fixture model, compiled in-process, with the fixture's weights loaded.
class TrainPlan {
 public:
  TrainPlan(int64_t microBatch, int64_t promptLength, DiffusionGemmaObjective objective)
      : config_(loadDiffusionGemmaConfig(kFixture + "/config.json")) {
    DiffusionGemmaTrainOptions options;
    options.microBatch = microBatch;
    options.promptLengths = {promptLength};
    options.objective = objective;
    auto module = mlir::dg::buildDiffusionGemmaTrain(context_, config_, options);
    EXPECT_TRUE(mlir::succeeded(mlir::verify(*module)));
    mlir::dg::PipelineOptions pipeline;
    pipeline.train = true;
    EXPECT_TRUE(mlir::succeeded(mlir::dg::runDifferentiationStage(*module, pipeline)));
    EXPECT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, pipeline)));
    auto plan = mlir::dg::lowerToPlan(*module, mlir::dg::PlanLoweringOptions{});
    EXPECT_TRUE(mlir::succeeded(plan));
    plan_ = std::move(*plan);
    backend_ = createBackend("cpu", 2);
    executor_ = std::make_unique<Executor>(plan_, *backend_, communicators_, "train-step-test");
    // The checkpoint keeps HF's encoder copies of layer_scalar: resolve names as dgemma-run does.
    SafetensorsDirectory checkpoint = SafetensorsDirectory::open(kFixture + "/model.safetensors");
    ResolvedCheckpoint resolved = resolveCheckpointNames(config_, checkpoint);
    loadWeights(*executor_, kFixture, [&](const std::string& name) -> std::optional<HostTensor> {
      auto found = resolved.textTensors.find(name);
      if (found == resolved.textTensors.end()) return std::nullopt;
      return found->second.file->read(found->second.entry->name);
    });
  }

  // Runs the entry on the inputs it takes (an objective without self-conditioning, say, reads no
  // self_conditioning_mask).
  Inputs run(const std::string& entryName, const Inputs& inputs) {
    for (const EntryPoint& entry : plan_.entryPoints) {
      if (entry.name != entryName) continue;
      Inputs taken;
      for (const NamedBuffer& input : entry.inputs) taken[input.name] = inputs.at(input.name);
      return executor_->run(entry, taken);
    }
    ADD_FAILURE() << "no entry " << entryName;
    return {};
  }

  const DiffusionGemmaConfig& config() const { return config_; }

 private:
  mlir::MLIRContext context_;
  DiffusionGemmaConfig config_;
  Plan plan_;
  std::unique_ptr<Backend> backend_;
  CommunicatorSet communicators_;
  std::unique_ptr<Executor> executor_;
};

HostTensor ids(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  HostTensor tensor(DType::I64, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<int64_t>());
  return tensor;
}

HostTensor floats(std::vector<int64_t> shape, const std::vector<float>& values) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<float>());
  return tensor;
}

// Rows `rows` of a [B, ...] tensor, stacked.
HostTensor takeRows(const HostTensor& tensor, const std::vector<int64_t>& rows) {
  std::vector<int64_t> shape = tensor.shape;
  shape[0] = static_cast<int64_t>(rows.size());
  HostTensor out(tensor.dtype, shape);
  const size_t rowBytes = tensor.data.size() / tensor.shape[0];
  for (size_t i = 0; i < rows.size(); ++i)
    std::memcpy(out.data.data() + i * rowBytes, tensor.data.data() + rows[i] * rowBytes, rowBytes);
  return out;
}

// A canvas of L ids per row (distinct per row and position) and its mask: row r has `valid[r]` real tokens.
Inputs canvas(int64_t vocab, int64_t length, const std::vector<int64_t>& valid) {
  std::vector<int64_t> values;
  std::vector<float> mask;
  for (size_t row = 0; row < valid.size(); ++row)
    for (int64_t l = 0; l < length; ++l) {
      values.push_back(l < valid[row] ? (7 + 5 * static_cast<int64_t>(row) + 3 * l) % vocab : 0);
      mask.push_back(l < valid[row] ? 1.0f : 0.0f);
    }
  const int64_t rows = static_cast<int64_t>(valid.size());
  return {{"canvas_ids", ids({rows, length}, values)}, {"canvas_mask", floats({rows, length}, mask)}};
}

DiffusionGemmaObjective withSelfConditioning(double probability) {
  DiffusionGemmaObjective objective;
  objective.selfConditioningProb = probability;
  return objective;
}

TEST(DiffusionGemmaCorruption, NoiseDependsOnlyOnTheSample) {
  // The same global samples as one micro-batch of 3 (in another order), as micro-batches of 1, and
  // split over two "data-parallel ranks": every example gets bit-identical t, canvas and coin.
  TrainPlan three(3, 4, withSelfConditioning(0.5)), one(1, 4, withSelfConditioning(0.5));
  const int64_t vocab = three.config().vocabSize, length = three.config().canvasLength;
  Inputs clean = canvas(vocab, length, {length, length - 2, 3});
  const std::vector<int64_t> samples = {41, 7, 1000003};
  const uint64_t seed = 1234, step = 17;

  Inputs batchInputs = clean;
  batchInputs["noise_keys"] = noiseKeys(seed, NoisePhase::Train, step, samples);
  Inputs together = three.run("corrupt", batchInputs);

  const std::vector<int64_t> permutation = {2, 0, 1};
  Inputs shuffled = {{"canvas_ids", takeRows(clean.at("canvas_ids"), permutation)},
                     {"canvas_mask", takeRows(clean.at("canvas_mask"), permutation)},
                     {"noise_keys", noiseKeys(seed, NoisePhase::Train, step, {samples[2], samples[0], samples[1]})}};
  Inputs permuted = three.run("corrupt", shuffled);

  for (int64_t row = 0; row < 3; ++row) {
    Inputs single = {{"canvas_ids", takeRows(clean.at("canvas_ids"), {row})},
                     {"canvas_mask", takeRows(clean.at("canvas_mask"), {row})},
                     {"noise_keys", noiseKeys(seed, NoisePhase::Train, step, {samples[row]})}};
    Inputs alone = one.run("corrupt", single);
    const int64_t permutedRow = std::find(permutation.begin(), permutation.end(), row) - permutation.begin();
    for (const char* name : {"diffusion_t", "noisy_canvas_ids", "self_conditioning_mask"}) {
      EXPECT_EQ(takeRows(together.at(name), {row}).data, alone.at(name).data) << name << " row " << row;
      EXPECT_EQ(takeRows(permuted.at(name), {permutedRow}).data, alone.at(name).data) << name << " row " << row;
    }
  }

  // Another step, another phase or another sample gives other noise.
  Inputs later = batchInputs, evaluation = batchInputs;
  later["noise_keys"] = noiseKeys(seed, NoisePhase::Train, step + 1, samples);
  evaluation["noise_keys"] = noiseKeys(seed, NoisePhase::Eval, step, samples);
  EXPECT_NE(three.run("corrupt", later).at("diffusion_t").data, together.at("diffusion_t").data);
  EXPECT_NE(three.run("corrupt", evaluation).at("diffusion_t").data, together.at("diffusion_t").data);
  const float* t = together.at("diffusion_t").as<float>();
  EXPECT_NE(t[0], t[1]);
}

TEST(DiffusionGemmaCorruption, RespectsTheNoiseRangeAndTheMask) {
  auto corrupt = [](double level) {
    DiffusionGemmaObjective objective;
    objective.noiseMin = objective.noiseMax = level;
    TrainPlan plan(3, 4, objective);
    const int64_t length = plan.config().canvasLength;
    Inputs inputs = canvas(plan.config().vocabSize, length, {length, 5, 0});
    inputs["noise_keys"] = noiseKeys(9, NoisePhase::Train, 0, {0, 1, 2});
    Inputs out = plan.run("corrupt", inputs);
    for (int64_t row = 0; row < 3; ++row) EXPECT_FLOAT_EQ(out.at("diffusion_t").as<float>()[row], static_cast<float>(level));
    // No self-conditioning configured: the mask is exactly zero.
    for (int64_t row = 0; row < 3; ++row) EXPECT_EQ(out.at("self_conditioning_mask").as<float>()[row], 0.0f);
    return std::make_pair(inputs, out);
  };

  // t = 0 leaves the canvas unchanged.
  auto [clean0, untouched] = corrupt(0.0);
  EXPECT_EQ(untouched.at("noisy_canvas_ids").data, clean0.at("canvas_ids").data);

  // t = 1 replaces every real token (the replacement equals the original only by chance, 1/V) and
  // never touches padding.
  auto [clean1, replaced] = corrupt(1.0);
  const int64_t* before = clean1.at("canvas_ids").as<int64_t>();
  const int64_t* after = replaced.at("noisy_canvas_ids").as<int64_t>();
  const float* mask = clean1.at("canvas_mask").as<float>();
  int64_t real = 0, changed = 0;
  std::set<int64_t> seen;
  for (int64_t i = 0; i < clean1.at("canvas_ids").numElements(); ++i) {
    if (mask[i] == 0) {
      EXPECT_EQ(after[i], before[i]) << "padding position " << i;
      continue;
    }
    ++real;
    changed += after[i] != before[i];
    seen.insert(after[i]);
  }
  EXPECT_GE(changed, real - 2);
  EXPECT_GT(seen.size(), 4u);  // replacements spread over the vocabulary
}

TEST(DiffusionGemmaCorruption, SelfConditioningCoinFollowsTheProbability) {
  TrainPlan always(4, 4, withSelfConditioning(1.0)), half(4, 4, withSelfConditioning(0.5));
  const int64_t length = always.config().canvasLength;
  int64_t chosen = 0, draws = 0;
  for (int64_t start = 0; start < 200; start += 4) {
    Inputs inputs = canvas(always.config().vocabSize, length, {length, length, length, length});
    inputs["noise_keys"] = noiseKeys(3, NoisePhase::Train, 0, {start, start + 1, start + 2, start + 3});
    for (int64_t row = 0; row < 4; ++row) EXPECT_EQ(always.run("corrupt", inputs).at("self_conditioning_mask").as<float>()[row], 1.0f);
    Inputs out = half.run("corrupt", inputs);
    for (int64_t row = 0; row < 4; ++row, ++draws) chosen += out.at("self_conditioning_mask").as<float>()[row] == 1.0f;
  }
  // 200 fair coins: 100 ± 5 standard deviations (7.07 each) never fails by chance.
  EXPECT_NEAR(static_cast<double>(chosen), draws / 2.0, 5 * std::sqrt(draws / 4.0));
}

// One train_step with injected noise; returns its outputs.
Inputs step(TrainPlan& plan, const Inputs& canvasInputs, const std::vector<float>& times) {
  const int64_t rows = static_cast<int64_t>(times.size()), promptLength = 4;
  std::vector<int64_t> prompt, promptMask;
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t p = 0; p < promptLength; ++p) {
      prompt.push_back(p == 0 ? plan.config().bosTokenId : 10 + row + 2 * p);
      promptMask.push_back(1);
    }
  Inputs inputs = canvasInputs;
  inputs["input_ids"] = ids({rows, promptLength}, prompt);
  inputs["attention_mask"] = ids({rows, promptLength}, promptMask);
  inputs["noisy_canvas_ids"] = inputs.at("canvas_ids");
  inputs["diffusion_t"] = floats({rows}, times);
  inputs["self_conditioning_mask"] = floats({rows}, std::vector<float>(rows, 0.0f));
  return plan.run("train_step", inputs);
}

DiffusionGemmaObjective decoderOnly(DiffusionGemmaObjective::Variant variant, std::optional<double> clip = std::nullopt) {
  DiffusionGemmaObjective objective;
  objective.variant = variant;
  objective.weightClip = clip;
  objective.encoderLossWeight = 0;
  return objective;
}

TEST(DiffusionGemmaObjective, ReweightingAnchors) {
  using Variant = DiffusionGemmaObjective::Variant;
  TrainPlan base(1, 4, decoderOnly(Variant::BaseSft));
  TrainPlan reweighted(1, 4, decoderOnly(Variant::ReweightedCe));
  TrainPlan clipped(1, 4, decoderOnly(Variant::ReweightedCe, 4.0));
  const int64_t length = base.config().canvasLength;
  Inputs clean = canvas(base.config().vocabSize, length, {length});
  // The same noisy canvas at every t, so the base loss is the same and only the weight moves.
  const float baseLoss = step(base, clean, {0.5f}).at("loss").as<float>()[0];
  ASSERT_GT(baseLoss, 0.0f);
  const std::vector<std::pair<float, double>> expectedWeights = {{0.0f, 1.0}, {0.5f, 2.0}, {0.99f, 100.0}};
  for (auto [time, weight] : expectedWeights) {
    EXPECT_NEAR(step(reweighted, clean, {time}).at("loss").as<float>()[0] / baseLoss, weight, weight * 2e-6) << "t = " << time;
    EXPECT_NEAR(step(clipped, clean, {time}).at("loss").as<float>()[0] / baseLoss, std::min(weight, 4.0), 1e-5) << "t = " << time;
  }
  // The loss of base-sft does not depend on t (the noisy canvas is fixed here).
  EXPECT_EQ(step(base, clean, {0.9f}).at("loss").as<float>()[0], baseLoss);
}

TEST(DiffusionGemmaObjective, EmptyCanvasRowsContributeZeroAndCountAsExamples) {
  using Variant = DiffusionGemmaObjective::Variant;
  TrainPlan pair(2, 4, decoderOnly(Variant::BaseSft)), single(1, 4, decoderOnly(Variant::BaseSft));
  const int64_t length = pair.config().canvasLength;
  Inputs both = canvas(pair.config().vocabSize, length, {length, 0});
  Inputs first = canvas(pair.config().vocabSize, length, {length});
  const float together = step(pair, both, {0.5f, 0.5f}).at("loss").as<float>()[0];
  const float alone = step(single, first, {0.5f}).at("loss").as<float>()[0];
  // ℓ = (ℓ_0 + 0) / 2: the empty row adds nothing but still counts in B (docs/training.md, "The four objectives", "Normalisation and reported losses").
  EXPECT_NEAR(together, alone / 2, 1e-6 * alone);
}

TEST(DiffusionGemmaObjective, LeaveOneOutRaisesTheObservedTokenLogit) {
  using Variant = DiffusionGemmaObjective::Variant;
  TrainPlan base(1, 4, decoderOnly(Variant::BaseSft)), leaveOneOut(1, 4, decoderOnly(Variant::LooCe));
  const int64_t length = base.config().canvasLength;
  Inputs clean = canvas(base.config().vocabSize, length, {length});
  // With xt = x0 the bonus δ(t) > 0 lands on the target logit, so the loss must drop; as t -> 1 the
  // bonus log(1 + K(1-t)/t) vanishes and the two objectives meet.
  const float baseLoss = step(base, clean, {0.5f}).at("loss").as<float>()[0];
  EXPECT_LT(step(leaveOneOut, clean, {0.5f}).at("loss").as<float>()[0], baseLoss);
  EXPECT_NEAR(step(leaveOneOut, clean, {0.999999f}).at("loss").as<float>()[0], baseLoss, 1e-3 * baseLoss);
}

}  // namespace
}  // namespace dgemma
