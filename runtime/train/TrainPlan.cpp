#include "runtime/train/TrainPlan.h"

#include <algorithm>
#include <optional>
#include <set>

#include "runtime/exec/PaddedRows.h"
#include "runtime/model/ModelAdapter.h"
#include "support/Error.h"

namespace dgemma {

namespace {

// The optimizer step's inputs: it reads the gradients from their buffers (docs/training.md, "The
// training loop").
const std::set<std::string> kOptimizerScalars = {"lr", "bias_correction1", "bias_correction2", "gradient_scale"};

bool hasName(const std::vector<NamedBuffer>& buffers, const std::string& name) {
  return std::any_of(buffers.begin(), buffers.end(), [&](const NamedBuffer& buffer) { return buffer.name == name; });
}

int64_t bucketSize(const EntryPoint& entry, const std::string& dimension, const std::string& planPath) {
  auto it = entry.bucket.find(dimension);
  if (it == entry.bucket.end()) throw InputError(planPath + ": entry " + entry.key() + ": bucket: no " + dimension);
  return it->second;
}

size_t entryIndex(const Plan& plan, const std::string& name, const std::string& planPath) {
  for (size_t i = 0; i < plan.entryPoints.size(); ++i)
    if (plan.entryPoints[i].name == name) return i;
  throw InputError(planPath + ": no \"" + name +
                   "\" entry point (compiled before gradients were device buffers; recompile the plan)");
}

std::string describeRows(const BatchRows& rows) {
  return "rows [" + std::to_string(rows.first) + ", " + std::to_string(rows.first + rows.count) + ")";
}

// The inputs of an image twin with one row per image, not per example (images of example b are rows
// [b·I, (b+1)·I)).
std::set<std::string> imageRowInputs(const ImageFieldNames& images) {
  return {images.pixelValues, images.imagePositionIds, images.imagePoolSlot};
}

// The rows of the global micro-batch that the boxes of `entries`' inputs hold. Every rank reads the
// whole global batch and keeps its rows of every field (the noise keys follow the samples), so the
// boxes must split the rows only, and all alike (an image input's rows are its examples' images).
BatchRows rankRowsOf(const Plan& plan, const std::vector<const EntryPoint*>& entries, int64_t microBatch,
                     int64_t imagesPerExample, const ImageFieldNames& images, const std::string& planPath) {
  const std::set<std::string> perImageRows = imageRowInputs(images);
  std::optional<BatchRows> split;
  std::string splitWhere, wholeWhere;
  for (const EntryPoint* entry : entries)
    for (const NamedBuffer& input : entry->inputs) {
      const std::string where = planPath + ": entry " + entry->key() + ": input " + input.name;
      if (input.isWhole()) {
        if (wholeWhere.empty()) wholeWhere = where;
        continue;
      }
      const Buffer& buffer = plan.buffers.at(input.buffer);
      const int64_t rowsPerExample = perImageRows.count(input.name) ? imagesPerExample : 1;
      if (input.globalShape.front() != microBatch * rowsPerExample)
        throw InputError(
            where + ": its global shape has " + std::to_string(input.globalShape.front()) +
            " rows, the global micro-batch " + std::to_string(microBatch) +
            (rowsPerExample == 1 ? std::string() : " x images per example " + std::to_string(rowsPerExample)));
      for (size_t d = 1; d < buffer.shape.size(); ++d)
        if (input.shardOffset[d] != 0 || buffer.shape[d] != input.globalShape[d])
          throw InputError(where + ": split in dimension " + std::to_string(d) +
                           " (the trainer splits a batch between ranks by rows only)");
      if (input.shardOffset.front() % rowsPerExample != 0 || buffer.shape.front() % rowsPerExample != 0)
        throw InputError(where + ": splits the images of one example between ranks");
      const BatchRows rows{input.shardOffset.front() / rowsPerExample, buffer.shape.front() / rowsPerExample};
      if (!split) {
        split = rows;
        splitWhere = where;
      } else if (rows != *split) {
        throw InputError(where + ": holds " + describeRows(rows) + ", " + splitWhere + " " + describeRows(*split) +
                         " (every batch input of a rank holds the same rows)");
      }
    }
  if (!split) return {0, microBatch};
  if (!wholeWhere.empty())
    throw InputError(wholeWhere + ": whole, while " + splitWhere + " holds " + describeRows(*split) +
                     " (every batch input of a rank holds the same rows)");
  return *split;
}

// The corrupt entry and the train_step entries (and their image twins) of a block-diffusion plan:
// one micro-batch and canvas, a prompt bucket per train_step.
void readBlockDiffusionSteps(TrainPlan& trainPlan, const EntryPoint& corrupt,
                             const std::vector<const EntryPoint*>& trainSteps,
                             const std::vector<const EntryPoint*>& imageTrainSteps, const ModelAdapter& model,
                             const Plan& plan, const std::string& planPath) {
  const ModelContract& names = model.contract();
  trainPlan.microBatch = bucketSize(corrupt, names.microBatchDimension, planPath);
  trainPlan.canvasLength = bucketSize(corrupt, names.canvasLengthDimension, planPath);
  for (const EntryPoint* entry : trainSteps) {
    if (bucketSize(*entry, names.microBatchDimension, planPath) != trainPlan.microBatch ||
        bucketSize(*entry, names.canvasLengthDimension, planPath) != trainPlan.canvasLength)
      throw InputError(planPath + ": entry " + entry->key() + ": its " + names.microBatchDimension + " and " +
                       names.canvasLengthDimension + " differ from " + names.corruptEntry + "'s " + corrupt.key());
    trainPlan.promptLengths.push_back(bucketSize(*entry, names.promptLengthDimension, planPath));
    // A policy loss (docs/rl.md) has no diffusion loss of its own; an SFT step reports both.
    const bool policyLoss = !names.advantages.empty() && hasName(entry->inputs, names.advantages);
    if (!hasName(entry->outputs, names.loss) || (!policyLoss && !hasName(entry->outputs, names.diffusionLoss)))
      throw InputError(planPath + ": entry " + entry->key() + ": expected the outputs " + names.loss + " and " +
                       names.diffusionLoss);
  }
  std::sort(trainPlan.promptLengths.begin(), trainPlan.promptLengths.end());
  // Image twins (dgemma-compile --images-per-example): one per text bucket, all with one I.
  for (const EntryPoint* entry : imageTrainSteps) {
    const int64_t images = bucketSize(*entry, "images_per_example", planPath);
    if (images < 1 || (trainPlan.imagesPerExample != 0 && images != trainPlan.imagesPerExample))
      throw InputError(
          planPath + ": entry " + entry->key() + ": bucket: images_per_example " + std::to_string(images) +
          (images < 1 ? ", expected at least 1" : ", another twin has " + std::to_string(trainPlan.imagesPerExample)));
    trainPlan.imagesPerExample = images;
    if (bucketSize(*entry, names.microBatchDimension, planPath) != trainPlan.microBatch ||
        bucketSize(*entry, names.canvasLengthDimension, planPath) != trainPlan.canvasLength ||
        std::find(trainPlan.promptLengths.begin(), trainPlan.promptLengths.end(),
                  bucketSize(*entry, names.promptLengthDimension, planPath)) == trainPlan.promptLengths.end())
      throw InputError(planPath + ": entry " + entry->key() + ": expected the buckets of a " + names.trainStepEntry +
                       " entry plus images_per_example");
  }
  if (!imageTrainSteps.empty() && imageTrainSteps.size() != trainSteps.size())
    throw InputError(planPath + ": " + std::to_string(imageTrainSteps.size()) + " " + names.imageTrainStepEntry +
                     " entries for " + std::to_string(trainSteps.size()) + " " + names.trainStepEntry +
                     " entries (expected one twin per prompt bucket)");
  if (trainPlan.imagesPerExample > 0) trainPlan.image = model.imageOptions(plan, planPath);
}

// The train_step entries of a pre-training plan (dgemma-compile --objective autoregressive |
// masked-diffusion | block-diffusion): one micro-batch, a packed length per entry, the objective told
// by the inputs and, for block diffusion, the canvas_len bucket dimension (TrainPlan.h).
void readPretrainingSteps(TrainPlan& trainPlan, const std::vector<const EntryPoint*>& trainSteps,
                          const ModelContract& names, const std::string& planPath) {
  const EntryPoint& first = *trainSteps.front();
  trainPlan.microBatch = bucketSize(first, names.microBatchDimension, planPath);
  const bool autoregressive = hasName(first.inputs, names.labels);
  const bool blocks = first.bucket.count(names.canvasLengthDimension) > 0;
  trainPlan.objective = autoregressive ? TrainObjective::Autoregressive
                        : blocks       ? TrainObjective::PackedBlockDiffusion
                                       : TrainObjective::MaskedDiffusion;
  if (blocks) trainPlan.canvasLength = bucketSize(first, names.canvasLengthDimension, planPath);
  for (const EntryPoint* entry : trainSteps) {
    if (bucketSize(*entry, names.microBatchDimension, planPath) != trainPlan.microBatch)
      throw InputError(planPath + ": entry " + entry->key() + ": its " + names.microBatchDimension + " differs from " +
                       first.key() + "'s");
    if (entry->bucket.count(names.canvasLengthDimension) != (blocks ? 1u : 0u) ||
        (blocks && bucketSize(*entry, names.canvasLengthDimension, planPath) != trainPlan.canvasLength))
      throw InputError(planPath + ": entry " + entry->key() + ": its " + names.canvasLengthDimension +
                       " differs from " + first.key() + "'s");
    trainPlan.sequenceLengths.push_back(bucketSize(*entry, names.sequenceLengthDimension, planPath));
    std::vector<std::string> inputs = {names.batch.inputIds, names.batch.positionIds, names.documentIds,
                                       names.lossMask};
    inputs.push_back(autoregressive ? names.labels : names.noiseKeys);
    for (const std::string& input : inputs)
      if (!hasName(entry->inputs, input))
        throw InputError(planPath + ": entry " + entry->key() + ": expected the input " + input +
                         " (a pre-training step of docs/pretraining.md, \"Objectives\")");
    if (!hasName(entry->outputs, names.loss))
      throw InputError(planPath + ": entry " + entry->key() + ": expected the output " + names.loss);
  }
  std::sort(trainPlan.sequenceLengths.begin(), trainPlan.sequenceLengths.end());
}

}  // namespace

const char* trainObjectiveName(TrainObjective objective) {
  switch (objective) {
    case TrainObjective::BlockDiffusion: return "block-diffusion";
    case TrainObjective::Autoregressive: return "autoregressive";
    case TrainObjective::MaskedDiffusion: return "masked-diffusion";
    case TrainObjective::PackedBlockDiffusion: return "block-diffusion on packed text";
  }
  return "?";
}

TrainPlan readTrainPlan(const Plan& plan, const std::string& planPath) {
  const ModelAdapter& model = modelAdapterFor(plan.modelFamily);
  const ModelContract& names = model.contract();
  // The trainer runs the diffusion objective: a family without a corruption entry has none.
  if (names.corruptEntry.empty())
    throw InputError(planPath +
                     ": not a DiffusionGemma plan (dgemma-run train needs dgemma-compile --model CONFIG --mode train)");
  const ModelTokens tokens = model.tokens(plan, planPath);
  TrainPlan trainPlan;
  trainPlan.padId = tokens.padId;
  trainPlan.bosId = tokens.bosId;
  trainPlan.eosId = tokens.eosId;
  trainPlan.vocabSize = tokens.vocabSize;

  const EntryPoint* corrupt = nullptr;
  const EntryPoint* optimizerStep = nullptr;
  std::vector<const EntryPoint*> trainSteps, imageTrainSteps;
  for (const EntryPoint& entry : plan.entryPoints) {
    if (entry.name == names.corruptEntry) corrupt = &entry;
    if (entry.name == names.trainStepEntry) trainSteps.push_back(&entry);
    if (entry.name == names.imageTrainStepEntry) imageTrainSteps.push_back(&entry);
    if (entry.name == "optimizer_step") optimizerStep = &entry;
  }
  if (!optimizerStep)
    throw InputError(planPath +
                     ": no \"optimizer_step\" entry point (compiled before dgemma-compile ran dg-optimizer-step; "
                     "recompile the plan)");
  std::vector<const EntryPoint*> batchEntries;
  if (!corrupt && !trainSteps.empty() && trainSteps.front()->bucket.count(names.sequenceLengthDimension)) {
    readPretrainingSteps(trainPlan, trainSteps, names, planPath);
    batchEntries = trainSteps;
  } else {
    if (!corrupt || trainSteps.empty())
      throw InputError(planPath + ": no \"" + names.corruptEntry + "\" and \"" + names.trainStepEntry +
                       "\" entry points (compiled with --mode infer?)");
    readBlockDiffusionSteps(trainPlan, *corrupt, trainSteps, imageTrainSteps, model, plan, planPath);
    batchEntries = trainSteps;
    batchEntries.insert(batchEntries.begin(), corrupt);
    batchEntries.insert(batchEntries.end(), imageTrainSteps.begin(), imageTrainSteps.end());
  }
  trainPlan.rankRows = rankRowsOf(plan, batchEntries, trainPlan.microBatch,
                                  std::max<int64_t>(trainPlan.imagesPerExample, 1), names.images, planPath);
  trainPlan.hasEncoderLoss = hasName(trainSteps.front()->outputs, names.encoderLoss);
  trainPlan.optimizerStep = static_cast<size_t>(optimizerStep - plan.entryPoints.data());
  for (const NamedBuffer& input : optimizerStep->inputs) {
    if (kOptimizerScalars.count(input.name)) continue;
    if (input.name.rfind(kGradientPrefix, 0) == 0)
      throw InputError(
          planPath + ": entry optimizer_step takes the gradient " + input.name +
          " as an input (compiled before gradients were device buffers); recompile the plan with dgemma-compile");
    throw InputError(planPath + ": entry optimizer_step: unexpected input " + input.name);
  }
  for (const std::string& scalar : kOptimizerScalars)
    if (!hasName(optimizerStep->inputs, scalar))
      throw InputError(planPath + ": entry optimizer_step: missing input " + scalar);
  if (!hasName(optimizerStep->outputs, "grad_norm"))
    throw InputError(planPath + ": entry optimizer_step: missing output grad_norm");

  for (const Parameter& parameter : plan.parameters) {
    if (parameter.name.rfind(kGradientPrefix, 0) == 0) trainPlan.gradients.push_back(parameter.name);
    else if (parameter.name.rfind(kOptimizerStatePrefix, 0) == 0)
      trainPlan.optimizerParameters.push_back(parameter.name);
    // An adapter plan's checkpoints hold its adapters, not the frozen base that --weights gives
    // (docs/training.md, "LoRA adapters").
    else if (!isRunState(parameter.name) && (!plan.adapter || parameter.trainable))
      trainPlan.modelParameters.push_back(parameter.name);
  }
  if (trainPlan.gradients.empty())
    throw InputError(planPath + ": no gradient buffer (a " + kGradientPrefix +
                     "<name> parameter); recompile the plan with dgemma-compile");
  trainPlan.gradientCheck = entryIndex(plan, kGradientCheckEntry, planPath);
  trainPlan.zeroGradients = entryIndex(plan, kZeroGradientsEntry, planPath);
  const EntryPoint& check = plan.entryPoints[trainPlan.gradientCheck];
  for (const std::string& gradient : trainPlan.gradients)
    if (!hasName(check.outputs, kNonFinitePrefix + gradient))
      throw InputError(planPath + ": entry " + check.key() + ": missing output " + kNonFinitePrefix + gradient);
  if (!plan.optimizer)
    throw InputError(planPath + ": optimizer: missing (recompile the plan with this dgemma-compile)");
  trainPlan.optimizer = *plan.optimizer;

  return trainPlan;
}

nlohmann::json checkpointIdentity(const Plan& plan, const TrainPlan& trainPlan) {
  // The objective and precision live only in the plan's metadata, where dgemma-compile records the
  // flags that chose them; the layout flags there are left out.
  nlohmann::json identity = {{"model_config", plan.modelConfig},
                             {"objective", plan.metadata.value("objective", nlohmann::json())},
                             {"precision", plan.metadata.value("precision", nlohmann::json())},
                             {"optimizer",
                              {{"beta1", trainPlan.optimizer.beta1},
                               {"beta2", trainPlan.optimizer.beta2},
                               {"eps", trainPlan.optimizer.epsilon},
                               {"weight_decay", trainPlan.optimizer.weightDecay},
                               {"max_grad_norm", trainPlan.optimizer.maxGradNorm}}}};
  nlohmann::json& parameters = identity["parameters"] = nlohmann::json::object();
  for (const Parameter& parameter : plan.parameters) {
    if (parameter.name.rfind(kGradientPrefix, 0) == 0 || isRunState(parameter.name)) continue;
    // The logical shape: a checkpoint holds no vocabulary padding, so any padding resumes it.
    parameters[parameter.name] = {{"shape", logicalShape(parameter)},
                                  {"dtype", std::string(dtypeName(plan.buffers.at(parameter.buffer).dtype))}};
  }
  return identity;
}

}  // namespace dgemma
