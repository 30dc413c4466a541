#include "runtime/train/Trainer.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <optional>

#include "support/Error.h"
#include "support/Json.h"
#include "runtime/core/NoiseKeys.h"
#include "plan/PlanFile.h"
#include "runtime/session/GlobalTensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/train/CheckpointFileDigest.h"
#include "runtime/train/CheckpointWriter.h"
#include "runtime/train/LrSchedule.h"
#include "runtime/train/MetricsWriter.h"
#include "runtime/train/OptimizerUpdate.h"
#include "runtime/train/PackedSplit.h"
#include "runtime/train/SaveDirectoryClaim.h"
#include "runtime/train/ProgressBar.h"
#include "runtime/train/Resume.h"
#include "runtime/train/ShardedSave.h"
#include "runtime/train/TensorBoardWriter.h"
#include "runtime/train/TrainData.h"
#include "runtime/train/TrainPlan.h"
#include "runtime/train/WorldGroup.h"

namespace dgemma {

namespace {

using Clock = std::chrono::steady_clock;

// Every evaluation draws the noise of this step (phase Eval): the same noise each time, so the
// losses of two evaluations differ only by the model.
constexpr uint64_t kEvaluationNoiseStep = 0;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

float scalarOutput(const std::map<std::string, HostTensor>& outputs, const std::string& name,
                   const std::string& entry) {
  auto it = outputs.find(name);
  if (it == outputs.end() || it->second.numElements() != 1)
    throw InputError("entry " + entry + ": expected a scalar output " + name);
  return convertDType(it->second, DType::F32, name).as<float>()[0];
}

std::string formatFloat(double value) {
  if (std::isnan(value)) return "nan";  // printf would give "-nan" for a negative one
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// Sums of the objective's scalars over micro-batches, in micro-batch order.
// The run's data: --train always, --validation and --test when given.
struct TrainSplits {
  std::unique_ptr<TrainSplit> train, validation, test;
};

struct LossSums {
  double loss = 0.0;
  double diffusionLoss = 0.0;
  double encoderLoss = 0.0;
  int64_t microBatches = 0;
};

// What the forward/backward half of an optimizer step produced besides the gradient sums, which
// stay in the plan's gradient buffers on the device.
struct StepGradients {
  LossSums losses;
  int64_t tokens = 0;
  std::string nonFinite;  // empty when every loss and gradient element is finite
};

class Trainer {
 public:
  Trainer(const TrainOptions& options, Session& session, const TrainPlan& trainPlan, TrainSplits splits)
      : options_(options),
        session_(session),
        trainPlan_(trainPlan),
        schedule_(scheduleConfig(options)),
        train_(std::move(splits.train)),
        validation_(std::move(splits.validation)),
        test_(std::move(splits.test)),
        world_(session.plan, *session.backend, session.communicators),
        identity_(trainingIdentity(options, session.plan, trainPlan)),
        config_(runConfig()),
        out_(world_.rank() == 0 ? std::cout.rdbuf() : nullptr) {}

  int run();

 private:
  static LrScheduleConfig scheduleConfig(const TrainOptions& options);
  static nlohmann::json trainingIdentity(const TrainOptions& options, const Plan& plan, const TrainPlan& trainPlan);
  int64_t globalBatch() const { return trainPlan_.microBatch * options_.accumulation; }
  nlohmann::json runConfig() const;
  void printSetup() const;
  bool resuming() const { return options_.resume || !options_.resumeFrom.empty(); }
  std::string checkpointTokenizerDir() const;
  nlohmann::json rngState() const;
  void restore();
  std::map<std::string, HostTensor> runMicroBatch(MicroBatch batch, NoisePhase phase, uint64_t noiseStep);
  void addLosses(LossSums& sums, const std::map<std::string, HostTensor>& outputs, const std::string& where,
                 std::string& nonFinite) const;
  // The per-step loss fields of a metrics line from the sums over its micro-batches.
  void setLosses(MetricsRecord& line, const LossSums& sums) const;
  StepGradients forwardBackward(int64_t step);
  std::string firstNonFiniteGradient();
  void zeroGradients();
  MetricsRecord evaluate(TrainSplit& data, MetricsSplit split, int64_t step, std::string& nonFinite);
  void evaluateAndRecord(TrainSplit& data, MetricsSplit split, int64_t step, ProgressBar& progress);
  void record(const MetricsRecord& line);
  CheckpointSaveResult save(int64_t step);

  const TrainOptions& options_;
  Session& session_;
  const TrainPlan& trainPlan_;
  LrSchedule schedule_;
  std::unique_ptr<TrainSplit> train_, validation_, test_;  // validation_ and test_ may be null
  WorldGroup world_;
  nlohmann::json identity_;  // what a checkpoint must match to be resumed (checkpointIdentity)
  nlohmann::json config_;
  // Rank 0 alone prints, writes metrics and TensorBoard; every other rank's lines go nowhere.
  mutable std::ostream out_;
  std::optional<MetricsWriter> metrics_;
  std::optional<TensorBoardWriter> tensorboard_;

  // The run state a checkpoint restores.
  int64_t step_ = 0;             // optimizer steps taken, skipped ones included
  int64_t optimizerSteps_ = 0;   // optimizer steps applied
  int64_t consumedSamples_ = 0;  // the next global sample index
  int64_t consumedTokens_ = 0;   // real tokens of the consumed samples
};

// What a checkpoint must match to be resumed: checkpointIdentity, and for an adapter plan over a
// --weights base the listing digest of that base, which its checkpoints do not hold (a resume
// re-reads it and must read the same one).
nlohmann::json Trainer::trainingIdentity(const TrainOptions& options, const Plan& plan, const TrainPlan& trainPlan) {
  nlohmann::json identity = checkpointIdentity(plan, trainPlan);
  if (plan.adapter && !options.session.weights.empty())
    identity["adapter_base"] = {{"weights_listing_xxh3", weightsListingDigest(options.session.weights)}};
  return identity;
}

LrScheduleConfig Trainer::scheduleConfig(const TrainOptions& options) {
  LrScheduleConfig config;
  config.maxLr = options.lr;
  config.minLr = options.minLr;
  config.warmupSteps = options.warmupSteps;
  config.decaySteps = options.decaySteps > 0 ? options.decaySteps : options.steps;
  config.style = parseLrDecayStyle(options.decayStyle);
  return config;
}

// The run's configuration as a checkpoint records it. The "trajectory" part is what a resumed run
// must repeat to continue the same sequence of steps (checkSameTrajectory); the rest is informational.
nlohmann::json Trainer::runConfig() const {
  const TrainOptions& f = options_;
  return {{"trajectory",
           {{"seed", f.session.seed},
            {"micro_batch", trainPlan_.microBatch},
            {"accumulation", f.accumulation},
            {"canvas_tail", f.canvasTail},
            {"train_items", train_->items()},
            {"lr_schedule", schedule_.toJson()}}},
          {"plan", f.session.planDir},
          {"weights", f.session.weights},
          {"init", f.session.init},
          {"train", f.train},
          {"validation", f.validation},
          {"test", f.test},
          {"tokenizer", f.tokenizer},
          {"steps", f.steps},
          {"global_batch", globalBatch()},
          {"optimizer",
           {{"beta1", trainPlan_.optimizer.beta1},
            {"beta2", trainPlan_.optimizer.beta2},
            {"eps", trainPlan_.optimizer.epsilon},
            {"weight_decay", trainPlan_.optimizer.weightDecay},
            {"max_grad_norm", trainPlan_.optimizer.maxGradNorm}}},
          {"eval_every", f.evalEvery},
          {"eval_batches", f.evalBatches},
          {"nan_policy", f.nanPolicy},
          {"skip_bad_rows", f.skipBadRows},
          {"save_every", f.saveEvery},
          {"keep", f.keep}};
}

void Trainer::printSetup() const {
  auto list = [](const std::vector<int64_t>& lengths) {
    std::string text;
    for (int64_t length : lengths) text += (text.empty() ? "" : ",") + std::to_string(length);
    return text;
  };
  const std::string shape =
      trainPlan_.objective == TrainObjective::BlockDiffusion
          ? "prompt buckets " + list(trainPlan_.promptLengths) + ", canvas " + std::to_string(trainPlan_.canvasLength)
          : trainObjectiveName(trainPlan_.objective) + std::string(", packed length ") +
                std::to_string(trainPlan_.sequenceLengths.back()) +
                (trainPlan_.objective == TrainObjective::PackedBlockDiffusion
                     ? ", blocks of " + std::to_string(trainPlan_.canvasLength)
                     : std::string());
  const OptimizerSettings& adam = trainPlan_.optimizer;
  out_ << "plan " << session_.planPath << " (" << world_.size() << (world_.size() == 1 ? " rank" : " ranks")
       << "): micro-batch " << trainPlan_.microBatch << " x accumulation " << options_.accumulation
       << " = global batch " << globalBatch() << ", " << shape << "\n"
       << "AdamW beta1 " << adam.beta1 << " beta2 " << adam.beta2 << " eps " << adam.epsilon << " weight decay "
       << adam.weightDecay << " clip " << adam.maxGradNorm << "; lr " << lrDecayStyleName(schedule_.config().style)
       << " " << formatFloat(options_.lr) << " -> " << formatFloat(options_.minLr) << ", warmup "
       << schedule_.config().warmupSteps << ", decay " << schedule_.config().decaySteps << " steps\n";
}

// What the manifest's "rng" records: the one seed every draw derives from, and how the noise is
// keyed (docs/training.md, "Noise keys"). A resume recomputes it and compares.
nlohmann::json Trainer::rngState() const { return {{"seed", options_.session.seed}, {"noise", "per_sample"}}; }

// Continues from a checkpoint (Resume.h): its parameters into the session, its counters into this run.
void Trainer::restore() {
  const ResumedCounters counters = resumeFromCheckpoint({.options = options_,
                                                         .trainPlan = trainPlan_,
                                                         .train = *train_,
                                                         .globalBatch = globalBatch(),
                                                         .identity = identity_,
                                                         .config = config_,
                                                         .rngState = rngState()},
                                                        world_, *session_.executor, out_);
  step_ = counters.step;
  optimizerSteps_ = counters.optimizerSteps;
  consumedSamples_ = counters.consumedSamples;
  consumedTokens_ = counters.consumedTokens;
}

// corrupt then train_step on one global micro-batch, its noise drawn from the keys of (seed, phase,
// noiseStep, global sample index); runEntry feeds this rank its box of every input. An image
// micro-batch runs train_step_images with the inputs derived from its images and prompts.
std::map<std::string, HostTensor> Trainer::runMicroBatch(MicroBatch batch, NoisePhase phase, uint64_t noiseStep) {
  const ModelContract& names = session_.model->contract();
  // A pre-training step draws its own noise from the keys (masked diffusion, block diffusion on
  // packed text) or draws nothing.
  if (trainPlan_.objective != TrainObjective::BlockDiffusion) {
    if (trainPlan_.objective == TrainObjective::MaskedDiffusion ||
        trainPlan_.objective == TrainObjective::PackedBlockDiffusion)
      batch.fields[names.noiseKeys] = noiseKeys(options_.session.seed, phase, noiseStep, batch.samples);
    return runEntry(session_, names.trainStepEntry, std::move(batch.fields), batch.where);
  }
  addDrawnCorruption(session_, batch.fields, options_.session.seed, phase, noiseStep, batch.samples, batch.where);
  if (!batch.images) return runEntry(session_, names.trainStepEntry, std::move(batch.fields), batch.where);
  addImagePlanInputs(batch.fields, trainPlan_.imagesPerExample, trainPlan_.image, names.images, batch.where);
  return runEntry(session_, names.imageTrainStepEntry, std::move(batch.fields), batch.where);
}

void Trainer::addLosses(LossSums& sums, const std::map<std::string, HostTensor>& outputs, const std::string& where,
                        std::string& nonFinite) const {
  const ModelContract& names = session_.model->contract();
  auto add = [&](const std::string& name, double& sum) {
    const float value = scalarOutput(outputs, name, names.trainStepEntry);
    if (!std::isfinite(value) && nonFinite.empty()) nonFinite = name + " is " + formatFloat(value) + " in " + where;
    sum += value;
  };
  add(names.loss, sums.loss);
  if (trainPlan_.objective == TrainObjective::BlockDiffusion) add(names.diffusionLoss, sums.diffusionLoss);
  if (trainPlan_.hasEncoderLoss) add(names.encoderLoss, sums.encoderLoss);
  ++sums.microBatches;
}

StepGradients Trainer::forwardBackward(int64_t step) {
  StepGradients result;
  for (int64_t micro = 0; micro < options_.accumulation; ++micro) {
    MicroBatch batch = train_->trainingMicroBatch(consumedSamples_ / trainPlan_.microBatch + micro);
    result.tokens += batch.tokens;
    const std::string where = "micro-batch " + std::to_string(micro + 1) + " of " +
                              std::to_string(options_.accumulation) + " (" + batch.where + ")";
    std::map<std::string, HostTensor> outputs =
        runMicroBatch(std::move(batch), NoisePhase::Train, static_cast<uint64_t>(step));
    // train_step added its gradients into the plan's f32 buffers, in micro-batch order.
    addLosses(result.losses, outputs, where, result.nonFinite);
  }
  // A NaN or infinity stays one under addition, so looking at the sums once finds every one.
  if (result.nonFinite.empty()) {
    const std::string gradient = firstNonFiniteGradient();
    if (!gradient.empty())
      result.nonFinite = "gradient " + gradient + " has a NaN or an infinity after " +
                         std::to_string(options_.accumulation) + " micro-batch(es) (" + train_->path() + ": samples " +
                         std::to_string(consumedSamples_) + ".." +
                         std::to_string(consumedSamples_ + globalBatch() - 1) + ")";
  }
  return result;
}

// The first gradient buffer, in plan order, with an element that is not finite on some rank; empty
// if none. gradient_check looks at this rank's shards on the device and hands out one scalar per
// buffer; the ranks agree on the least index, so they skip or abort the step together.
std::string Trainer::firstNonFiniteGradient() {
  const EntryPoint& entry = session_.plan.entryPoints[trainPlan_.gradientCheck];
  const std::map<std::string, HostTensor> flags = session_.executor->run(entry, {});
  const int64_t none = static_cast<int64_t>(trainPlan_.gradients.size());
  int64_t first = none;
  for (int64_t i = 0; i < none && first == none; ++i)
    if (!std::isfinite(scalarOutput(flags, kNonFinitePrefix + trainPlan_.gradients[i], entry.key()))) first = i;
  first = world_.minimum(first);
  return first == none ? "" : trainPlan_.gradients[first];
}

// Discards what train_step added to the gradient buffers (a skipped step's, an evaluation's).
void Trainer::zeroGradients() { session_.executor->run(session_.plan.entryPoints[trainPlan_.zeroGradients], {}); }

// The objective on the first micro-batches of a split in file order (at most --eval-batches), text
// and image items in turns as in training, each modality's last micro-batch wrapping around to its
// first items to fill the bucket (docs/data.md, "Item order"), with evaluation-phase
// noise. The gradients train_step also adds into the buffers are zeroed afterwards, so the next
// step starts from zero. `nonFinite` names a NaN or Inf loss.
MetricsRecord Trainer::evaluate(TrainSplit& data, MetricsSplit split, int64_t step, std::string& nonFinite) {
  const Clock::time_point start = Clock::now();
  int64_t microBatches = data.evaluationMicroBatches();
  if (options_.evalBatches > 0) microBatches = std::min(microBatches, options_.evalBatches);
  LossSums sums;
  MetricsRecord line;
  for (int64_t micro = 0; micro < microBatches; ++micro) {
    MicroBatch batch = data.evaluationMicroBatch(micro);
    line.tokens += batch.tokens;
    const std::string where = batch.where;
    addLosses(sums, runMicroBatch(std::move(batch), NoisePhase::Eval, kEvaluationNoiseStep), where, nonFinite);
  }
  zeroGradients();
  line.step = step;
  line.split = split;
  setLosses(line, sums);
  // A pre-training loss is a mean per token: the autoregressive cross-entropy, masked diffusion's
  // bound on it, or block diffusion's denoising cross-entropy (docs/pretraining.md, "Training").
  if (trainPlan_.objective != TrainObjective::BlockDiffusion)
    line.extra.push_back({"perplexity", static_cast<double>(std::exp(static_cast<double>(line.loss)))});
  line.consumedSamples = consumedSamples_;
  line.seconds = secondsSince(start);
  return line;
}

// A non-finite evaluation loss stops the run like a training one (docs/training.md), after its line;
// with --nan-policy skip it is reported and the run goes on (there is no update to skip).
void Trainer::evaluateAndRecord(TrainSplit& data, MetricsSplit split, int64_t step, ProgressBar& progress) {
  std::string nonFinite;
  const MetricsRecord line = evaluate(data, split, step, nonFinite);
  record(line);
  const std::string what = "step " + std::to_string(step) + ": " + metricsSplitName(split);
  if (nonFinite.empty()) {
    progress.message(what + " loss " + formatFloat(line.loss));
    return;
  }
  if (options_.nanPolicy == "abort")
    throw RuntimeError(what + ": " + nonFinite + " (--nan-policy skip reports it and goes on)");
  progress.message(what + ": " + nonFinite);
}

void Trainer::setLosses(MetricsRecord& line, const LossSums& sums) const {
  const double micro = static_cast<double>(sums.microBatches);
  line.loss = static_cast<float>(sums.loss / micro);
  if (trainPlan_.objective == TrainObjective::BlockDiffusion)
    line.diffusionLoss = static_cast<float>(sums.diffusionLoss / micro);
  if (trainPlan_.hasEncoderLoss) line.encoderLoss = static_cast<float>(sums.encoderLoss / micro);
}

void Trainer::record(const MetricsRecord& line) {
  if (metrics_) metrics_->write(line);
  if (!tensorboard_) return;
  const std::string prefix = metricsSplitName(line.split) + "/";
  const ModelContract& names = session_.model->contract();
  tensorboard_->addScalar(prefix + names.loss, line.step, line.loss);
  if (line.diffusionLoss) tensorboard_->addScalar(prefix + names.diffusionLoss, line.step, *line.diffusionLoss);
  for (const auto& [name, value] : line.extra)
    if (const double* number = std::get_if<double>(&value))
      tensorboard_->addScalar(prefix + name, line.step, static_cast<float>(*number));
  if (line.encoderLoss) tensorboard_->addScalar(prefix + names.encoderLoss, line.step, *line.encoderLoss);
  if (line.lr) tensorboard_->addScalar(prefix + "lr", line.step, static_cast<float>(*line.lr));
  if (line.gradNorm) tensorboard_->addScalar(prefix + "grad_norm", line.step, *line.gradNorm);
}

// The tokenizer files a checkpoint carries: --tokenizer's, else those beside --weights (a checkpoint
// or HF directory that has them); none for --train mock from --init random.
std::string Trainer::checkpointTokenizerDir() const {
  if (!options_.tokenizer.empty()) return options_.tokenizer;
  const std::filesystem::path weights(options_.session.weights);
  if (!options_.session.weights.empty() && std::filesystem::is_directory(weights) &&
      holdsTokenizer(options_.session.weights))
    return options_.session.weights;
  return "";
}

// Every rank saves its boxes of the model and the optimizer state; the step count is whole on every
// rank, so rank 0 writes it.
CheckpointSaveResult Trainer::save(int64_t step) {
  HostTensor count(DType::I64, std::vector<int64_t>{});
  count.as<int64_t>()[0] = optimizerSteps_;
  std::vector<SavedGroup> groups = {
      {"model", trainPlan_.modelParameters, {}},
      {"optimizer", trainPlan_.optimizerParameters, {{"optimizer", kOptimizerStepCount, &count}}}};
  // The checkpoint is a model directory of the family's HF library too (docs/training.md,
  // "Checkpoints"): where HF stores a second copy of a parameter (replicated: whole on every rank),
  // rank 0 adds it, and its commit writes the model's side files (config, tokenizer).
  const Plan& plan = session_.executor->plan();
  const ModelAdapter& model = *session_.model;
  std::vector<HostTensor> secondCopies;
  std::vector<std::string> secondCopyNames;
  for (const std::string& name : trainPlan_.modelParameters)
    if (std::optional<std::string> copy = plan.adapter ? std::nullopt : model.secondCopyName(name)) {
      secondCopies.push_back(session_.executor->parameter(name));
      secondCopyNames.push_back(*copy);
    }
  for (size_t i = 0; i < secondCopies.size(); ++i)
    groups[0].replicated.push_back({"model", secondCopyNames[i], &secondCopies[i]});

  CheckpointState state;
  state.model = identity_;
  state.step = step;
  state.consumedSamples = consumedSamples_;
  state.dataOrderState = train_->orderState(consumedSamples_);
  state.rng = rngState();
  state.config = config_;
  CheckpointSaveOptions options;
  options.keep = options_.keep;
  options.wholeGroups = {"model"};
  // An adapter plan's checkpoint is the family's adapter directory instead (docs/training.md, "LoRA
  // adapters"): its model group holds the adapters alone, the base stays where --weights is.
  if (plan.adapter) {
    std::vector<std::pair<std::string, std::string>> files =
        adapterCheckpointFiles(session_, world_, trainPlan_.modelParameters, options_.session.weights);
    if (world_.rank() == 0) options.extraFiles = std::move(files);
  } else if (world_.rank() == 0) {
    options.extraFiles = model.checkpointSideFiles(plan, checkpointTokenizerDir());
  }
  return saveShardedCheckpoint(world_, *session_.executor, options_.saveDir, state, groups, options);
}

int Trainer::run() {
  printSetup();
  if (resuming()) restore();
  if (step_ == options_.steps) {
    out_ << "the run is complete at step " << step_ << "; nothing to do\n";
    return 0;
  }
  if (world_.rank() == 0 && !options_.metrics.empty())
    metrics_ = resuming() ? MetricsWriter::resume(options_.metrics, step_) : MetricsWriter::create(options_.metrics);
  if (world_.rank() == 0 && !options_.tensorboard.empty()) {
    TensorBoardWriter::Options options;
    if (resuming()) options.resumedStep = step_;
    tensorboard_ = TensorBoardWriter::open(options_.tensorboard, options);
  }
  ProgressOptions progressOptions;
  progressOptions.totalSteps = options_.steps;
  progressOptions.firstStep = step_;
  progressOptions.isTty = world_.rank() == 0 && options_.progressInPlace && ::isatty(STDOUT_FILENO) != 0;
  progressOptions.everySteps = options_.logEvery;
  ProgressBar progress(out_, progressOptions);

  const Clock::time_point start = Clock::now();
  int64_t tokensThisRun = 0, skippedSteps = 0;
  bool outOfTime = false;
  while (step_ < options_.steps && !outOfTime) {
    const Clock::time_point stepStart = Clock::now();
    const int64_t step = step_ + 1;
    StepGradients gradients = forwardBackward(step);
    const double lr = schedule_.forOptimizerStep(optimizerSteps_ + 1);
    const bool skipped = !gradients.nonFinite.empty();
    float gradNorm = std::numeric_limits<float>::quiet_NaN();
    if (skipped) {
      zeroGradients();
    } else {
      ++optimizerSteps_;
      gradNorm = applyOptimizerUpdate(session_, trainPlan_, optimizerSteps_, lr,
                                      1.0 / static_cast<double>(options_.accumulation));
    }
    step_ = step;
    consumedSamples_ += globalBatch();
    consumedTokens_ += gradients.tokens;
    tokensThisRun += gradients.tokens;

    MetricsRecord line;
    line.step = step;
    setLosses(line, gradients.losses);
    line.lr = lr;
    line.gradNorm = gradNorm;
    line.consumedSamples = consumedSamples_;
    line.tokens = consumedTokens_;
    line.seconds = secondsSince(stepStart);
    if (skipped) line.extra.push_back({"skipped", true});
    record(line);
    const double elapsed = secondsSince(start);
    progress.update({step, line.loss, lr, gradNorm, elapsed > 0 ? tokensThisRun / elapsed : 0.0, elapsed});
    if (skipped) {
      if (options_.nanPolicy == "abort")
        throw RuntimeError("step " + std::to_string(step) + ": " + gradients.nonFinite +
                           "; stopped before the update (--nan-policy skip skips such steps)");
      ++skippedSteps;
      progress.message("step " + std::to_string(step) + " skipped, no update: " + gradients.nonFinite);
    }

    // Every rank ends at the same step: rank 0's clock decides.
    outOfTime = options_.maxSeconds > 0 && world_.fromRankZero(secondsSince(start) >= options_.maxSeconds ? 1 : 0) == 1;
    if (outOfTime)
      progress.message("--max-seconds " + formatFloat(options_.maxSeconds) + " reached at step " +
                       std::to_string(step));
    // Every line of a step goes out before its checkpoint (MetricsWriter::resume relies on it).
    const bool last = step == options_.steps || outOfTime;
    if (validation_ && (last || (options_.evalEvery > 0 && step % options_.evalEvery == 0)))
      evaluateAndRecord(*validation_, MetricsSplit::Validation, step, progress);
    if (test_ && last) evaluateAndRecord(*test_, MetricsSplit::Test, step, progress);
    if (!options_.saveDir.empty() && (last || (options_.saveEvery > 0 && step % options_.saveEvery == 0))) {
      CheckpointSaveResult saved = save(step);
      std::string removed;
      for (const std::string& directory : saved.removed) removed += ", removed " + directory;
      progress.message("saved checkpoint " + saved.directory + " (" + formatFloat(saved.bytesWritten / 1e6) +
                       " MB in " + formatFloat(saved.seconds) + " s" + removed + ")");
    }
  }
  progress.finish();
  if (tensorboard_) tensorboard_->flush();
  out_ << "trained to step " << step_ << " in " << formatFloat(secondsSince(start)) << " s, " << tokensThisRun
       << " tokens, " << skippedSteps << " steps skipped\n";
  return 0;
}

void checkOptions(const TrainOptions& options) {
  if (options.session.weights.empty() == options.session.init.empty())
    throw InputError("give exactly one of --weights DIR and --init random");
  if (options.steps < 1) throw InputError("--steps: required (the plan has no preset run defaults)");
  if (options.resume && options.saveDir.empty())
    throw InputError("--resume: needs --save-dir, the directory to resume from");
  if (options.resume && !options.resumeFrom.empty())
    throw InputError(
        "--resume-from: give it instead of --resume, not with it (--resume takes the newest checkpoint in --save-dir)");
  if (options.saveEvery > 0 && options.saveDir.empty()) throw InputError("--save-every: needs --save-dir");
  if (options.overwrite && options.saveDir.empty())
    throw InputError("--overwrite: needs --save-dir, the directory to start afresh in");
  if (options.overwrite && (options.resume || !options.resumeFrom.empty()))
    throw InputError(
        "--overwrite: deletes the checkpoints that --resume and --resume-from continue; give one or the other");
  if (!options.dataPath.empty()) {
    if (!options.train.empty() || !options.validation.empty() || !options.test.empty())
      throw InputError(
          "--data-path: give it instead of --train, --validation and --test (its --split makes the "
          "validation and test parts)");
    return;
  }
  if (options.train.empty()) throw InputError("--train: required (or --data-path, for a pre-training plan)");
  if (options.train == kMockSplit) {
    if (!options.validation.empty() || !options.test.empty())
      throw InputError(std::string("--train ") + kMockSplit + ": smoke-test data has no --validation or --test split");
    return;
  }
  if (options.tokenizer.empty() && options.session.weights.empty())
    throw InputError(
        "--tokenizer: required with --init random (a directory with tokenizer.model, tokenizer.json or "
        "vocab.json + merges.txt)");
  checkSplits(options.train, options.validation, options.test);
}

}  // namespace

namespace {

// A pre-training plan's splits: the parts of --split of the --data-path blend, the training part
// built for the schedule's whole length (the sample order depends on it, as Megatron's does).
TrainSplits loadPackedSplits(const TrainOptions& options, const TrainPlan& trainPlan, const Plan& plan) {
  if (options.dataPath.empty())
    throw InputError(std::string("--data-path: required: the plan's train_step is the ") +
                     trainObjectiveName(trainPlan.objective) +
                     " pre-training objective over packed documents (docs/pretraining.md, \"Training\")");
  PackedSplitOptions packed;
  packed.flag = "--data-path";
  packed.dataPath = parseDataPath(options.dataPath);
  packed.split = parseSplit(options.split);
  packed.sequenceLength = trainPlan.sequenceLengths.back();
  packed.microBatch = trainPlan.microBatch;
  packed.seed = options.session.seed;
  packed.cacheDirectory = options.dataCacheDir;
  packed.objective = trainPlan.objective;
  packed.vocabSize = trainPlan.vocabSize;
  const ModelContract& names = modelAdapterFor(plan.modelFamily).contract();
  std::ostream* log = plan.rank == 0 ? &std::cerr : nullptr;
  auto part = [&](SplitPart which) {
    PackedSplitOptions options = packed;
    options.part = which;
    return std::make_unique<PackedSplit>(options, names, log);
  };
  const int64_t scheduleSteps = std::max(options.steps, options.decaySteps);
  int64_t trainingSamples = 0;
  if (__builtin_mul_overflow(scheduleSteps, trainPlan.microBatch * options.accumulation, &trainingSamples))
    throw InputError("--steps: " + std::to_string(scheduleSteps) + " steps of the global batch exceed 2^63 samples");
  packed.trainingSamples = trainingSamples;
  TrainSplits splits;
  splits.train = part(SplitPart::Train);
  packed.trainingSamples = 0;
  packed.evaluationMicroBatches = options.evalBatches;
  if (packed.split.weights[1] > 0) splits.validation = part(SplitPart::Validation);
  if (packed.split.weights[2] > 0) splits.test = part(SplitPart::Test);
  if (plan.rank == 0) {
    std::cout << splits.train->path() << ": " << splits.train->items() << " samples of " << packed.sequenceLength
              << " tokens\n";
    for (const std::unique_ptr<TrainSplit>* split : {&splits.validation, &splits.test})
      if (*split) std::cout << (*split)->path() << ": " << (*split)->items() << " samples\n";
  }
  return splits;
}

// Every rank builds the same splits (each reads the whole global batch); rank 0 reports them.
TrainSplits loadSplits(const TrainOptions& options, const TrainPlan& trainPlan, const Plan& plan) {
  if (trainPlan.objective != TrainObjective::BlockDiffusion) return loadPackedSplits(options, trainPlan, plan);
  if (!options.dataPath.empty())
    throw InputError(
        "--data-path: feeds a pre-training plan (dgemma-compile --objective autoregressive | "
        "masked-diffusion); this plan's step is block diffusion over chat rows: give --train");
  SplitOptions splitOptions;
  splitOptions.canvasLength = trainPlan.canvasLength;
  splitOptions.maxEncoderLength = trainPlan.promptLengths.back();
  splitOptions.vocabSize = trainPlan.vocabSize;
  splitOptions.imagesPerExample = trainPlan.imagesPerExample;
  splitOptions.image = trainPlan.image;
  splitOptions.skipBadRows = options.skipBadRows;
  splitOptions.quiet = plan.rank != 0;
  CollateOptions collate;
  collate.canvasLength = trainPlan.canvasLength;
  collate.padId = trainPlan.padId;
  if (options.canvasTail == "eos_fill") collate.scoredCanvasFill = trainPlan.eosId;
  const ModelContract& names = modelAdapterFor(plan.modelFamily).contract();
  auto blocks = [&](Dataset dataset) {
    return std::make_unique<BlockSplit>(std::move(dataset), trainPlan.microBatch, options.session.seed, collate,
                                        trainPlan.image, names);
  };
  TrainSplits splits;
  if (options.train == kMockSplit) {
    splits.train = blocks(mockSplit(splitOptions, trainPlan.bosId, trainPlan.eosId, options.session.seed));
    return splits;
  }
  const Tokenizer tokenizer(options.tokenizer.empty() ? options.session.weights : options.tokenizer);
  tokenizer.checkVocabSize(trainPlan.vocabSize);
  splits.train = blocks(loadSplit("--train", options.train, tokenizer, splitOptions));
  if (!options.validation.empty())
    splits.validation = blocks(loadSplit("--validation", options.validation, tokenizer, splitOptions));
  if (!options.test.empty()) splits.test = blocks(loadSplit("--test", options.test, tokenizer, splitOptions));
  return splits;
}

int train(const TrainOptions& options, Session& session, const TrainPlan& trainPlan, TrainSplits splits) {
  Trainer trainer(options, session, trainPlan, std::move(splits));
  return trainer.run();
}

// A policy-loss plan's train_step needs advantages that only `dgemma-run rl` has (docs/rl.md).
void refusePolicyLossPlan(const Plan& plan, const std::string& planPath) {
  const ModelContract& names = modelAdapterFor(plan.modelFamily).contract();
  for (const EntryPoint& entry : plan.entryPoints)
    if (entry.name == names.trainStepEntry && !names.advantages.empty() &&
        std::any_of(entry.inputs.begin(), entry.inputs.end(),
                    [&](const NamedBuffer& input) { return input.name == names.advantages; }))
      throw InputError("--plan: " + planPath +
                       ": a policy-loss plan (dgemma-compile --policy-loss); train it with dgemma-run rl");
}

// Rank 0 claims --save-dir for the run's life, before any work (SaveDirectoryClaim.h).
std::unique_ptr<SaveDirectoryClaim> claimSaveDirectory(const TrainOptions& options, int64_t rank) {
  if (options.saveDir.empty() || rank != 0) return nullptr;
  SaveDirectoryRequest request;
  request.saveDir = options.saveDir;
  request.runIdentity = options.runIdentity.empty() ? newRunIdentity() : options.runIdentity;
  request.resuming = options.resume || !options.resumeFrom.empty();
  request.overwrite = options.overwrite;
  return std::make_unique<SaveDirectoryClaim>(request);
}

}  // namespace

int runTrain(const TrainOptions& options, Plan plan) {
  checkOptions(options);
  const std::unique_ptr<SaveDirectoryClaim> claim = claimSaveDirectory(options, plan.rank);
  refusePolicyLossPlan(plan, options.session.planDir);
  const TrainPlan trainPlan = readTrainPlan(plan, planFileForRank(options.session.planDir, options.session.rank));
  // The data is checked before the weights load, which can take long for a large model.
  TrainSplits splits = loadSplits(options, trainPlan, plan);
  std::unique_ptr<Session> session = openSession(options.session, std::move(plan));
  return train(options, *session, trainPlan, std::move(splits));
}

int runTrain(const TrainOptions& options, Session& session) {
  checkOptions(options);
  const std::unique_ptr<SaveDirectoryClaim> claim = claimSaveDirectory(options, session.plan.rank);
  refusePolicyLossPlan(session.plan, session.planPath);
  const TrainPlan trainPlan = readTrainPlan(session.plan, session.planPath);
  TrainSplits splits = loadSplits(options, trainPlan, session.plan);
  return train(options, session, trainPlan, std::move(splits));
}

}  // namespace dgemma
