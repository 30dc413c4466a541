#include "runtime/rl/GrpoTrainer.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>

#include "runtime/core/NoiseKeys.h"
#include "runtime/data/batch/Blocks.h"
#include "runtime/generate/DrawSource.h"
#include "runtime/generate/EntryRuns.h"
#include "runtime/generate/Evaluation.h"
#include "runtime/generate/Generator.h"
#include "runtime/rl/GroupAdvantages.h"
#include "runtime/session/GlobalTensors.h"
#include "runtime/session/RunEntry.h"
#include "runtime/train/CheckpointListing.h"
#include "runtime/train/CheckpointReader.h"
#include "runtime/train/LrSchedule.h"
#include "runtime/train/MetricsWriter.h"
#include "runtime/train/OptimizerUpdate.h"
#include "runtime/train/Resume.h"
#include "runtime/train/ShardedSave.h"
#include "runtime/train/TensorBoardWriter.h"
#include "runtime/train/TrainPlan.h"
#include "runtime/train/WorldGroup.h"
#include "support/Error.h"

namespace dgemma {

namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The seed of step `step`'s rollouts: the run seed and the step mixed by SplitMix64's finalizer, so
// that the draws of (step, request) pairs never coincide across steps (GenerationKeys.h keys the
// rest by request, canvas and pass).
uint64_t rolloutSeed(uint64_t seed, int64_t step) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ULL * (static_cast<uint64_t>(step) + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// One completion of a prompt: the tokens it trains on (the answer, with its EOS when it stopped at
// one) and its reward.
struct Rollout {
  int64_t prompt = -1;  // index in the prompt set; -1 in the padding records of the exchange
  std::vector<int64_t> completion;
  double reward = 0.0;
};

// The scalar or [B] output `name`, as doubles.
std::vector<double> outputValues(const std::map<std::string, HostTensor>& outputs, const std::string& name,
                                 const std::string& entry) {
  auto it = outputs.find(name);
  if (it == outputs.end()) throw InputError("entry " + entry + ": expected an output " + name);
  const HostTensor wide = convertDType(it->second, DType::F64, name);
  return std::vector<double>(wide.as<double>(), wide.as<double>() + wide.numElements());
}

HostTensor f32Rows(const std::vector<double>& values) {
  HostTensor tensor(DType::F32, {static_cast<int64_t>(values.size())});
  for (size_t i = 0; i < values.size(); ++i) tensor.as<float>()[i] = static_cast<float>(values[i]);
  return tensor;
}

std::string formatFloat(double value) {
  if (std::isnan(value)) return "nan";
  char text[32];
  std::snprintf(text, sizeof text, "%.6g", value);
  return text;
}

// The sampler's entropy at the positions it accepted, summed over a step's denoising passes: how sure
// the policy is of what it writes.
class AcceptedEntropy : public GenerationObserver {
 public:
  void onDenoisePass(const DenoisePassReport& report) override {
    for (size_t i = 0; i < report.accepted.size(); ++i)
      if (report.accepted[i]) {
        sum += report.entropy[i];
        ++count;
      }
  }
  double sum = 0;
  int64_t count = 0;
};

// One row of the policy loss: a block of a rollout's completion at one diffusion time.
struct Example {
  const BlockItem* item = nullptr;
  double advantage = 0.0;
};

// A micro-batch of examples with its drawn corruption, kept for every pass over it (the old policy's
// estimate, the reference's and each update's): the shared noise of the estimate.
struct PolicyBatch {
  std::map<std::string, HostTensor> fields;
  std::vector<double> advantages, oldLogps, refLogps;
  int64_t rows = 0;  // real rows; the rest pad the micro-batch and contribute nothing
  std::string where;
};

class GrpoTrainer {
 public:
  GrpoTrainer(const RlOptions& options, Session& policy, const std::vector<RlPrompt>& prompts,
              const Tokenizer& tokenizer, RewardFunction& reward)
      : options_(options),
        policy_(policy),
        prompts_(prompts),
        tokenizer_(tokenizer),
        reward_(reward),
        names_(policy.model->contract()),
        trainPlan_(readTrainPlan(policy.plan, policy.planPath)),
        world_(policy.plan, *policy.backend, policy.communicators),
        order_(static_cast<int64_t>(prompts.size()), options.session.seed),
        schedule_(scheduleConfig(options)),
        out_(world_.rank() == 0 ? std::cout.rdbuf() : nullptr) {
    checkPolicyPlan();
    openRollouts();
    if (usesReference_)
      for (const std::string& name : trainPlan_.modelParameters)
        reference_.emplace(name, policy_.executor->parameter(name));
    collate_.canvasLength = trainPlan_.canvasLength;
    collate_.padId = trainPlan_.padId;
  }

  int run();

 private:
  static LrScheduleConfig scheduleConfig(const RlOptions& options);
  void checkPolicyPlan();
  void openRollouts();
  nlohmann::json runConfig() const;
  void restore();
  void syncRolloutWeights();
  std::vector<Rollout> rollouts(int64_t step, const std::vector<int64_t>& stepPrompts, AcceptedEntropy& entropy);
  std::vector<Rollout> exchange(const std::vector<Rollout>& mine, int64_t perRank);
  std::vector<PolicyBatch> policyBatches(int64_t step, const std::vector<Rollout>& all,
                                         const std::vector<double>& advantages, std::vector<BlockItem>& items);
  void addReferenceLogps(std::vector<PolicyBatch>& batches);
  void save(int64_t step);

  const RlOptions& options_;
  Session& policy_;
  const std::vector<RlPrompt>& prompts_;
  const Tokenizer& tokenizer_;
  RewardFunction& reward_;
  const ModelContract& names_;
  TrainPlan trainPlan_;
  WorldGroup world_;
  PromptOrder order_;
  LrSchedule schedule_;
  CollateOptions collate_;
  mutable std::ostream out_;
  bool usesReference_ = false;  // the plan's loss has the KL term: its train_step takes ref_logps
  std::map<std::string, HostTensor> reference_;  // this rank's boxes of the starting weights
  std::unique_ptr<Session> rolloutSession_;
  std::unique_ptr<Generator> generator_;
  std::optional<MetricsWriter> metrics_;
  std::optional<TensorBoardWriter> tensorboard_;

  int64_t step_ = 0;
  int64_t optimizerSteps_ = 0;
  int64_t consumedPrompts_ = 0;
};

LrScheduleConfig GrpoTrainer::scheduleConfig(const RlOptions& options) {
  LrScheduleConfig config;
  config.maxLr = options.lr;
  config.minLr = options.minLr;
  config.warmupSteps = options.warmupSteps;
  config.decaySteps = std::max<int64_t>(options.steps * options.innerUpdates, 1);
  config.style = parseLrDecayStyle(options.decayStyle);
  return config;
}

// The training plan must be a policy-loss plan: its train_step takes the advantages and the old
// policy's estimate, and it has the logps entry.
void GrpoTrainer::checkPolicyPlan() {
  const Plan& plan = policy_.plan;
  if (names_.logpsEntry.empty()) throw InputError(policy_.planPath + ": this model family has no policy loss");
  const EntryPoint* trainStep = nullptr;
  bool hasLogps = false;
  for (const EntryPoint& entry : plan.entryPoints) {
    if (entry.name == names_.trainStepEntry && !trainStep) trainStep = &entry;
    if (entry.name == names_.logpsEntry) hasLogps = true;
  }
  if (!trainStep || !hasLogps || !takesInput(*trainStep, names_.advantages) || !takesInput(*trainStep, names_.oldLogps))
    throw InputError("--plan: " + policy_.planPath +
                     ": expected a policy-loss training plan (dgemma-compile --mode train --policy-loss grpo), whose " +
                     names_.trainStepEntry + " takes " + names_.advantages + " and " + names_.oldLogps +
                     " and which has a " + names_.logpsEntry + " entry");
  usesReference_ = takesInput(*trainStep, names_.refLogps);
  if (trainPlan_.imagesPerExample > 0)
    throw InputError("--plan: " + policy_.planPath +
                     ": dgemma-run rl trains on text prompts; compile without --images-per-example");
}

// Every rank samples its share of the rollouts on its own copy of the inference plan (one rank).
void GrpoTrainer::openRollouts() {
  SessionOptions rollout;
  rollout.planDir = options_.rolloutPlan;
  rollout.weights = options_.session.weights;
  rollout.init = options_.session.init;
  rollout.seed = options_.session.seed;
  rollout.backend = options_.session.backend;
  rollout.threads = options_.session.threads;
  rollout.device = options_.session.device;
  rolloutSession_ = openSession(rollout);
  GeneratorOptions generation;
  generation.maxNewTokens = options_.maxNewTokens;
  generation.maxDenoisingSteps = options_.denoisingSteps;
  generation.temperatureScale = options_.temperature;
  generator_ = std::make_unique<Generator>(*rolloutSession_, generation);
  if (generator_->vocabSize() != trainPlan_.vocabSize)
    throw InputError("--rollout-plan: " + options_.rolloutPlan + ": a vocabulary of " +
                     std::to_string(generator_->vocabSize()) + ", the training plan's has " +
                     std::to_string(trainPlan_.vocabSize) + " (compile both from one model)");
  const Plan& rolloutPlan = rolloutSession_->plan;
  for (const std::string& name : trainPlan_.modelParameters)
    if (std::none_of(rolloutPlan.parameters.begin(), rolloutPlan.parameters.end(),
                     [&](const Parameter& parameter) { return parameter.name == name; }))
      throw InputError("--rollout-plan: " + options_.rolloutPlan + ": has no parameter " + name +
                       ", which the policy trains (compile it from the same model, with the same --lora flags)");
  // Every completion block must fit the training plan's encoder context.
  const int64_t canvases = generator_->canvases();
  for (const RlPrompt& prompt : prompts_) {
    const int64_t context = static_cast<int64_t>(prompt.promptIds.size()) + (canvases - 1) * trainPlan_.canvasLength;
    if (context > trainPlan_.promptLengths.back())
      throw InputError(prompt.where + ": its last completion block needs an encoder context of " +
                       std::to_string(context) + " tokens (prompt and " + std::to_string(canvases - 1) +
                       " earlier canvases); the training plan's largest --prompt-len bucket is " +
                       std::to_string(trainPlan_.promptLengths.back()) + " (recompile it, or lower --max-new-tokens)");
    if (static_cast<int64_t>(prompt.promptIds.size()) > generator_->maxPromptLength())
      throw InputError(prompt.where + ": the prompt has " + std::to_string(prompt.promptIds.size()) +
                       " tokens; the rollout plan's largest prefill bucket holds " +
                       std::to_string(generator_->maxPromptLength()));
  }
}

// The policy's trained parameters into the rollout plan: each whole (assembled from the ranks'
// boxes on a sharded plan), so the sampler runs the weights the next update starts from.
void GrpoTrainer::syncRolloutWeights() {
  for (const std::string& name : trainPlan_.modelParameters) {
    const auto parameter = std::find_if(policy_.plan.parameters.begin(), policy_.plan.parameters.end(),
                                        [&](const Parameter& candidate) { return candidate.name == name; });
    HostTensor local = policy_.executor->parameter(name);
    if (parameter->shardShape != parameter->globalShape)
      local = assembleGlobal(*policy_.world, local, {parameter->shardOffset, parameter->shardShape},
                             parameter->globalShape, "parameter " + name);
    rolloutSession_->executor->setParameter(name, local);
  }
}

nlohmann::json GrpoTrainer::runConfig() const {
  return {{"trajectory",
           {{"seed", options_.session.seed},
            {"group_size", options_.groupSize},
            {"prompts_per_step", options_.promptsPerStep},
            {"inner_updates", options_.innerUpdates},
            {"diffusion_samples", options_.diffusionSamples},
            {"max_new_tokens", generator_->settings().maxNewTokens},
            {"denoising_steps", generator_->settings().maxDenoisingSteps},
            {"temperature_scale", options_.temperature},
            {"negative_advantage_scale", options_.negativeAdvantageScale},
            {"prompts", prompts_.size()},
            {"reward", options_.rewardName},
            {"lr_schedule", schedule_.toJson()}}},
          {"plan", options_.session.planDir},
          {"rollout_plan", options_.rolloutPlan},
          {"weights", options_.session.weights},
          {"prompts_file", options_.prompts},
          {"steps", options_.steps}};
}

// Rank r of W samples the groups of its contiguous share of the step's prompts.
std::vector<Rollout> GrpoTrainer::rollouts(int64_t step, const std::vector<int64_t>& stepPrompts,
                                           AcceptedEntropy& entropy) {
  std::vector<GenerationRequest> requests;
  for (int64_t prompt : stepPrompts)
    for (int64_t member = 0; member < options_.groupSize; ++member) {
      GenerationRequest request;
      request.id = prompt * options_.groupSize + member;  // keys the draws with the step's seed
      request.promptIds = prompts_[prompt].promptIds;
      requests.push_back(std::move(request));
    }
  CounterDrawSource draws(rolloutSeed(options_.session.seed, step), generator_->vocabSize());
  const std::vector<GenerationResult> results = generator_->generate(requests, draws, &entropy);
  const GenerationSettings& settings = generator_->settings();
  std::vector<Rollout> rollouts;
  std::vector<RewardItem> items;
  for (size_t i = 0; i < results.size(); ++i) {
    Rollout rollout;
    rollout.prompt = stepPrompts[i / options_.groupSize];
    // The answer as the sampler wrote it (pads dropped), with the EOS that ended it.
    for (int64_t token : results[i].newTokens) {
      if (token == settings.padTokenId) continue;
      rollout.completion.push_back(token);
      if (std::find(settings.eosTokenIds.begin(), settings.eosTokenIds.end(), token) != settings.eosTokenIds.end())
        break;
    }
    const RlPrompt& prompt = prompts_[rollout.prompt];
    items.push_back({prompt.text,
                     answerText(tokenizer_, results[i].newTokens, settings.eosTokenIds, settings.padTokenId),
                     prompt.reference, prompt.where});
    rollouts.push_back(std::move(rollout));
  }
  const std::vector<double> rewards = reward_.score(items);
  for (size_t i = 0; i < rollouts.size(); ++i) {
    if (!std::isfinite(rewards[i]))
      throw RuntimeError(items[i].where + ": reward " + reward_.name() + " gave " + formatFloat(rewards[i]));
    rollouts[i].reward = rewards[i];
  }
  return rollouts;
}

// Every rank's rollouts on every rank, in rank order (which is prompt order): each rollout as a
// fixed-size record [prompt, reward bits, length, tokens...], every rank sending `perRank` records.
std::vector<Rollout> GrpoTrainer::exchange(const std::vector<Rollout>& mine, int64_t perRank) {
  if (world_.size() == 1) return mine;
  const int64_t width = 3 + generator_->settings().maxNewTokens;
  std::vector<int64_t> records(static_cast<size_t>(perRank * width), -1);
  for (size_t i = 0; i < mine.size(); ++i) {
    int64_t* record = records.data() + i * width;
    record[0] = mine[i].prompt;
    record[1] = std::bit_cast<int64_t>(mine[i].reward);
    record[2] = static_cast<int64_t>(mine[i].completion.size());
    std::copy(mine[i].completion.begin(), mine[i].completion.end(), record + 3);
  }
  const std::vector<int64_t> gathered = world_.allGather(records);
  std::vector<Rollout> all;
  for (size_t offset = 0; offset < gathered.size(); offset += width) {
    const int64_t* record = gathered.data() + offset;
    if (record[0] < 0) continue;
    Rollout rollout;
    rollout.prompt = record[0];
    rollout.reward = std::bit_cast<double>(record[1]);
    rollout.completion.assign(record + 3, record + 3 + record[2]);
    all.push_back(std::move(rollout));
  }
  return all;
}

// The step's examples (every block of every completion, diffusionSamples times) in micro-batches
// of the plan's global micro-batch, each with its corruption drawn once from (seed, step, example).
// A short last micro-batch is padded with rows of no scored token and advantage 0.
std::vector<PolicyBatch> GrpoTrainer::policyBatches(int64_t step, const std::vector<Rollout>& all,
                                                    const std::vector<double>& advantages,
                                                    std::vector<BlockItem>& items) {
  items.clear();
  std::vector<double> itemAdvantages;
  for (size_t i = 0; i < all.size(); ++i) {
    if (all[i].completion.empty()) continue;  // nothing sampled to score
    TokenizedRow row;
    row.where = prompts_[all[i].prompt].where + " rollout " + std::to_string(i);
    row.promptIds = prompts_[all[i].prompt].promptIds;
    row.promptTokenTypes.assign(row.promptIds.size(), 0);
    row.completionIds = all[i].completion;
    for (BlockItem& item : splitIntoBlocks(row, trainPlan_.canvasLength, trainPlan_.promptLengths.back())) {
      items.push_back(std::move(item));
      itemAdvantages.push_back(advantages[i]);
    }
  }
  std::vector<Example> examples;
  for (size_t i = 0; i < items.size(); ++i)
    for (int64_t sample = 0; sample < options_.diffusionSamples; ++sample)
      examples.push_back({&items[i], itemAdvantages[i]});

  const int64_t rowsPerBatch = trainPlan_.microBatch;
  std::vector<PolicyBatch> batches;
  for (size_t first = 0; first < examples.size(); first += static_cast<size_t>(rowsPerBatch)) {
    PolicyBatch batch;
    std::vector<const BlockItem*> rows;
    std::vector<int64_t> samples;
    for (int64_t row = 0; row < rowsPerBatch; ++row) {
      const size_t index = std::min(first + static_cast<size_t>(row), examples.size() - 1);
      const bool real = first + static_cast<size_t>(row) < examples.size();
      rows.push_back(examples[index].item);
      samples.push_back(static_cast<int64_t>(first) + row);
      batch.advantages.push_back(real ? examples[index].advantage : 0.0);
      batch.rows += real ? 1 : 0;
    }
    batch.where = "step " + std::to_string(step) + " examples " + std::to_string(first) + ".." +
                  std::to_string(first + static_cast<size_t>(rowsPerBatch) - 1);
    batch.fields = collate(rows, collate_, names_.batch);
    // Padding rows score nothing: canvas mask 0, so their estimate is exactly 0.
    HostTensor& mask = batch.fields.at(names_.batch.canvasMask);
    const int64_t canvas = mask.shape[1];
    for (int64_t row = batch.rows; row < rowsPerBatch; ++row)
      std::fill(mask.as<float>() + row * canvas, mask.as<float>() + (row + 1) * canvas, 0.0f);
    addDrawnCorruption(policy_, batch.fields, options_.session.seed, NoisePhase::Train, static_cast<uint64_t>(step),
                       samples, batch.where);
    batches.push_back(std::move(batch));
  }
  return batches;
}

// The frozen reference policy's estimate of every batch on its shared noise: the starting weights
// swapped in once for all the batches' logps runs, then the current ones back.
void GrpoTrainer::addReferenceLogps(std::vector<PolicyBatch>& batches) {
  std::map<std::string, HostTensor> current;
  for (const std::string& name : trainPlan_.modelParameters) {
    current.emplace(name, policy_.executor->parameter(name));
    policy_.executor->setParameter(name, reference_.at(name));
  }
  for (PolicyBatch& batch : batches)
    batch.refLogps =
        outputValues(runEntry(policy_, names_.logpsEntry, batch.fields, batch.where), names_.logps, names_.logpsEntry);
  for (auto& [name, value] : current) policy_.executor->setParameter(name, value);
}

void GrpoTrainer::restore() {
  std::optional<CheckpointEntry> newest = newestCheckpoint(options_.saveDir);
  const std::vector<int64_t> steps = world_.allGather({newest ? newest->step : -1});
  for (int64_t seen : steps)
    if (seen != steps[0])
      throw InputError("--resume: " + options_.saveDir + ": the ranks see different newest checkpoints");
  if (!newest) throw InputError("--resume: " + options_.saveDir + ": no complete checkpoint");
  const CheckpointReader checkpoint =
      CheckpointReader::load(newest->directory, checkpointIdentity(policy_.plan, trainPlan_));
  const nlohmann::json& saved = checkpoint.state().config;
  const nlohmann::json trajectory = runConfig().at("trajectory");
  if (!saved.contains("trajectory") || saved.at("trajectory") != trajectory)
    throw InputError(checkpoint.directory() + "/manifest.json: config.trajectory: the checkpoint's run used " +
                     (saved.contains("trajectory") ? saved.at("trajectory").dump() : std::string("none")) +
                     ", this run " + trajectory.dump() + " (a resumed run repeats the flags that decide its steps)");
  restoreParameters(checkpoint, "model", trainPlan_.modelParameters, *policy_.executor);
  restoreParameters(checkpoint, "optimizer", trainPlan_.optimizerParameters, *policy_.executor);
  const HostTensor count = checkpoint.read("optimizer", kOptimizerStepCount);
  if (count.dtype != DType::I64 || count.numElements() != 1)
    throw InputError(checkpoint.directory() + ": group 'optimizer': tensor '" + kOptimizerStepCount +
                     "': expected one i64");
  optimizerSteps_ = count.as<int64_t>()[0];
  step_ = checkpoint.state().step;
  consumedPrompts_ = checkpoint.state().consumedSamples;
  out_ << "resumed from " << checkpoint.directory() << ": step " << step_ << ", consumed prompts " << consumedPrompts_
       << "\n";
}

void GrpoTrainer::save(int64_t step) {
  HostTensor count(DType::I64, std::vector<int64_t>{});
  count.as<int64_t>()[0] = optimizerSteps_;
  std::vector<SavedGroup> groups = {
      {"model", trainPlan_.modelParameters, {}},
      {"optimizer", trainPlan_.optimizerParameters, {{"optimizer", kOptimizerStepCount, &count}}}};
  CheckpointState state;
  state.model = checkpointIdentity(policy_.plan, trainPlan_);
  state.step = step;
  state.consumedSamples = consumedPrompts_;
  state.dataOrderState = {{"sampler", "prompt_epochs"}, {"seed", options_.session.seed}, {"prompts", prompts_.size()}};
  state.rng = {{"seed", options_.session.seed}, {"rollouts", "per_step_request"}, {"noise", "per_step_example"}};
  state.config = runConfig();
  CheckpointSaveOptions saveOptions;
  saveOptions.keep = options_.keep;
  saveOptions.wholeGroups = {"model"};
  // As a training run's: an adapter plan's checkpoint is the family's adapter directory, a full
  // one a model directory (docs/training.md, "Checkpoints").
  if (policy_.plan.adapter) {
    std::vector<std::pair<std::string, std::string>> files =
        adapterCheckpointFiles(policy_, world_, trainPlan_.modelParameters, options_.session.weights);
    if (world_.rank() == 0) saveOptions.extraFiles = std::move(files);
  } else if (world_.rank() == 0) {
    saveOptions.extraFiles = policy_.model->checkpointSideFiles(policy_.plan, tokenizer_.directory());
  }
  const CheckpointSaveResult saved =
      saveShardedCheckpoint(world_, *policy_.executor, options_.saveDir, state, groups, saveOptions);
  out_ << "saved checkpoint " << saved.directory << "\n";
}

int GrpoTrainer::run() {
  if (options_.resume) restore();
  if (step_ >= options_.steps) {
    out_ << "the run is complete at step " << step_ << "; nothing to do\n";
    return 0;
  }
  if (world_.rank() == 0 && !options_.metrics.empty())
    metrics_ =
        options_.resume ? MetricsWriter::resume(options_.metrics, step_) : MetricsWriter::create(options_.metrics);
  if (world_.rank() == 0 && !options_.tensorboard.empty()) {
    TensorBoardWriter::Options tensorboardOptions;
    if (options_.resume) tensorboardOptions.resumedStep = step_;
    tensorboard_ = TensorBoardWriter::open(options_.tensorboard, tensorboardOptions);
  }
  out_ << "rl: " << prompts_.size() << " prompts, " << options_.promptsPerStep << " per step x group "
       << options_.groupSize << ", " << options_.innerUpdates << " update(s) per step, reward " << reward_.name()
       << ", " << (usesReference_ ? "KL to the starting weights" : "no KL term") << ", " << world_.size()
       << (world_.size() == 1 ? " rank" : " ranks") << "\n";

  const int64_t ranks = world_.size();
  const int64_t promptsPerRank = (options_.promptsPerStep + ranks - 1) / ranks;
  const Clock::time_point runStart = Clock::now();
  bool outOfTime = false;
  while (step_ < options_.steps && !outOfTime) {
    const int64_t step = step_ + 1;
    const Clock::time_point stepStart = Clock::now();

    // Rollouts: this rank's share of the step's prompts, on the current weights.
    std::vector<int64_t> stepPrompts;
    for (int64_t i = 0; i < options_.promptsPerStep; ++i) stepPrompts.push_back(order_.promptAt(consumedPrompts_ + i));
    const int64_t shareBegin = std::min<int64_t>(world_.rank() * promptsPerRank, options_.promptsPerStep);
    const int64_t shareEnd = std::min<int64_t>(shareBegin + promptsPerRank, options_.promptsPerStep);
    syncRolloutWeights();
    AcceptedEntropy entropy;
    const std::vector<Rollout> mine =
        rollouts(step, std::vector<int64_t>(stepPrompts.begin() + shareBegin, stepPrompts.begin() + shareEnd), entropy);
    const std::vector<Rollout> all = exchange(mine, promptsPerRank * options_.groupSize);
    double entropySum = 0, acceptedTokens = 0;
    const std::vector<int64_t> entropies = world_.allGather({std::bit_cast<int64_t>(entropy.sum), entropy.count});
    for (size_t rank = 0; rank < entropies.size(); rank += 2) {
      entropySum += std::bit_cast<double>(entropies[rank]);
      acceptedTokens += static_cast<double>(entropies[rank + 1]);
    }
    const double rolloutSeconds = secondsSince(stepStart);

    std::vector<double> rewards;
    double completionTokens = 0;
    for (const Rollout& rollout : all) {
      rewards.push_back(rollout.reward);
      completionTokens += static_cast<double>(rollout.completion.size());
    }
    std::vector<double> advantages = groupAdvantages(rewards, options_.groupSize);
    scaleNegativeAdvantages(advantages, options_.negativeAdvantageScale);

    // The policy loss: the old policy's (and the reference's) estimate on each batch's noise, then
    // the inner updates over the same batches and noise.
    const Clock::time_point updateStart = Clock::now();
    std::vector<BlockItem> items;
    std::vector<PolicyBatch> batches = policyBatches(step, all, advantages, items);
    for (PolicyBatch& batch : batches)
      batch.oldLogps = outputValues(runEntry(policy_, names_.logpsEntry, batch.fields, batch.where), names_.logps,
                                    names_.logpsEntry);
    if (usesReference_) addReferenceLogps(batches);
    double lossSum = 0, klSum = 0, clipped = 0, realRows = 0;
    float gradNorm = 0;
    double lr = 0;
    for (int64_t update = 0; update < options_.innerUpdates; ++update) {
      for (const PolicyBatch& batch : batches) {
        std::map<std::string, HostTensor> fields = batch.fields;
        fields[names_.advantages] = f32Rows(batch.advantages);
        fields[names_.oldLogps] = f32Rows(batch.oldLogps);
        if (usesReference_) fields[names_.refLogps] = f32Rows(batch.refLogps);
        const std::map<std::string, HostTensor> outputs =
            runEntry(policy_, names_.trainStepEntry, std::move(fields), batch.where);
        const double loss = outputValues(outputs, names_.loss, names_.trainStepEntry).at(0);
        if (!std::isfinite(loss)) throw RuntimeError(batch.where + ": the policy loss is " + formatFloat(loss));
        lossSum += loss;
        const std::vector<double> rowsClipped = outputValues(outputs, names_.clipped, names_.trainStepEntry);
        const std::vector<double> rowsKl =
            usesReference_ ? outputValues(outputs, names_.klTerm, names_.trainStepEntry) : std::vector<double>();
        for (int64_t row = 0; row < batch.rows; ++row) {
          clipped += rowsClipped[row];
          if (usesReference_) klSum += rowsKl[row];
          realRows += 1;
        }
      }
      ++optimizerSteps_;
      lr = schedule_.forOptimizerStep(optimizerSteps_);
      gradNorm = applyOptimizerUpdate(policy_, trainPlan_, optimizerSteps_, lr,
                                      1.0 / static_cast<double>(std::max<size_t>(batches.size(), 1)));
    }
    const double updateSeconds = secondsSince(updateStart);
    step_ = step;
    consumedPrompts_ += options_.promptsPerStep;

    double mean = 0, squares = 0, passed = 0;
    for (double reward : rewards) {
      mean += reward;
      passed += reward >= options_.passThreshold ? 1 : 0;
    }
    mean /= static_cast<double>(rewards.size());
    for (double reward : rewards) squares += (reward - mean) * (reward - mean);
    const double rewardStd = std::sqrt(squares / static_cast<double>(rewards.size()));
    const double passRate = passed / static_cast<double>(rewards.size());
    const double updates = static_cast<double>(options_.innerUpdates * std::max<size_t>(batches.size(), 1));

    MetricsRecord line;
    line.step = step;
    line.loss = static_cast<float>(lossSum / updates);
    line.diffusionLoss = line.loss;
    line.lr = lr;
    line.gradNorm = gradNorm;
    line.consumedSamples = consumedPrompts_;
    line.tokens = static_cast<int64_t>(completionTokens);
    line.seconds = secondsSince(stepStart);
    line.extra = {{"reward_mean", mean},
                  {"reward_std", rewardStd},
                  {"pass_rate", passRate},
                  {"kl_mean", usesReference_ && realRows > 0 ? klSum / realRows : 0.0},
                  {"clip_fraction", realRows > 0 ? clipped / realRows : 0.0},
                  {"accepted_entropy", acceptedTokens > 0 ? entropySum / acceptedTokens : 0.0},
                  {"completion_tokens_mean", completionTokens / static_cast<double>(rewards.size())},
                  {"examples", static_cast<int64_t>(realRows / static_cast<double>(options_.innerUpdates))},
                  {"rollout_seconds", rolloutSeconds},
                  {"update_seconds", updateSeconds}};
    if (metrics_) metrics_->write(line);
    if (tensorboard_) {
      tensorboard_->addScalar("rl/loss", step, line.loss);
      tensorboard_->addScalar("rl/reward_mean", step, static_cast<float>(mean));
      tensorboard_->addScalar("rl/reward_std", step, static_cast<float>(rewardStd));
      tensorboard_->addScalar("rl/pass_rate", step, static_cast<float>(passRate));
      tensorboard_->addScalar("rl/clip_fraction", step, static_cast<float>(realRows > 0 ? clipped / realRows : 0.0));
      if (usesReference_)
        tensorboard_->addScalar("rl/kl_mean", step, static_cast<float>(realRows > 0 ? klSum / realRows : 0.0));
      tensorboard_->addScalar("rl/lr", step, static_cast<float>(lr));
      tensorboard_->addScalar("rl/grad_norm", step, gradNorm);
    }
    out_ << "step " << step << "/" << options_.steps << ": reward " << formatFloat(mean) << " +- "
         << formatFloat(rewardStd) << ", pass " << formatFloat(passRate) << ", loss " << formatFloat(line.loss)
         << ", clip " << formatFloat(realRows > 0 ? clipped / realRows : 0.0)
         << (usesReference_ ? ", kl " + formatFloat(klSum / std::max(realRows, 1.0)) : "") << ", rollouts "
         << formatFloat(rolloutSeconds) << " s, update " << formatFloat(updateSeconds) << " s\n"
         << std::flush;
    // Every rank stops at the same step: rank 0's clock decides.
    outOfTime =
        options_.maxSeconds > 0 && world_.fromRankZero(secondsSince(runStart) >= options_.maxSeconds ? 1 : 0) == 1;
    if (outOfTime)
      out_ << "--max-seconds " << formatFloat(options_.maxSeconds) << " reached after step " << step << "\n";
    const bool last = step == options_.steps || outOfTime;
    if (!options_.saveDir.empty() && (last || (options_.saveEvery > 0 && step % options_.saveEvery == 0))) save(step);
  }
  if (tensorboard_) tensorboard_->flush();
  return 0;
}

}  // namespace

int runGrpo(const RlOptions& options, Session& policy, const std::vector<RlPrompt>& prompts, const Tokenizer& tokenizer,
            RewardFunction& reward) {
  if (prompts.empty()) throw InputError("--prompts: " + options.prompts + ": no prompt");
  if (options.steps < 1) throw InputError("--steps: expected at least 1");
  if (options.groupSize < 2)
    throw InputError("--group-size: expected at least 2 (advantages compare a group's rollouts)");
  if (options.resume && options.saveDir.empty()) throw InputError("--resume: needs --save-dir");
  GrpoTrainer trainer(options, policy, prompts, tokenizer, reward);
  return trainer.run();
}

}  // namespace dgemma
