#include "tools/dgemma-run/TrainPlan.h"

#include <algorithm>
#include <set>

#include "models/diffusion_gemma/Config.h"
#include "support/Error.h"

namespace dgemma::tool {

namespace {

// The optimizer step's inputs besides the gradients (docs/training.md, "The training loop").
const std::set<std::string> kOptimizerScalars = {"lr", "bias_correction1", "bias_correction2", "gradient_scale"};

bool hasName(const std::vector<NamedBuffer>& buffers, const std::string& name) {
  return std::any_of(buffers.begin(), buffers.end(), [&](const NamedBuffer& buffer) { return buffer.name == name; });
}

int64_t bucketSize(const EntryPoint& entry, const std::string& dimension, const std::string& planPath) {
  auto it = entry.bucket.find(dimension);
  if (it == entry.bucket.end()) throw InputError(planPath + ": entry " + entry.key() + ": bucket: no " + dimension);
  return it->second;
}

OptimizerSettings readOptimizerSettings(const nlohmann::json& metadata, const std::string& planPath) {
  auto it = metadata.find("optimizer");
  if (it == metadata.end() || !it->is_object())
    throw InputError(planPath + ": metadata.optimizer: missing (the plan's optimizer_step records beta1 and beta2 there; "
                                "recompile it with this dgemma-compile)");
  auto number = [&](const char* field) {
    auto value = it->find(field);
    if (value == it->end() || !value->is_number())
      throw InputError(planPath + ": metadata.optimizer." + field + ": expected a number");
    return value->get<double>();
  };
  OptimizerSettings settings;
  settings.beta1 = number("beta1");
  settings.beta2 = number("beta2");
  settings.epsilon = number("eps");
  settings.weightDecay = number("weight_decay");
  settings.maxGradNorm = number("max_grad_norm");
  for (auto [name, beta] : {std::pair{"beta1", settings.beta1}, std::pair{"beta2", settings.beta2}})
    if (!(beta >= 0.0 && beta < 1.0))
      throw InputError(planPath + ": metadata.optimizer." + name + ": expected a value in [0, 1), got " + std::to_string(beta));
  return settings;
}

}  // namespace

TrainPlan readTrainPlan(const Plan& plan, const std::string& planPath) {
  if (plan.metadata.value("model_family", std::string()) != "diffusion_gemma" || !plan.metadata.contains("model_config"))
    throw InputError(planPath + ": not a DiffusionGemma plan (dgemma-run train needs dgemma-compile --model CONFIG --mode train)");
  const DiffusionGemmaConfig config =
      parseDiffusionGemmaConfig(plan.metadata.at("model_config"), planPath + ": metadata.model_config");
  TrainPlan trainPlan;
  trainPlan.padId = config.padTokenId;
  trainPlan.vocabSize = config.vocabSize;

  const EntryPoint* corrupt = nullptr;
  const EntryPoint* optimizerStep = nullptr;
  std::vector<const EntryPoint*> trainSteps;
  for (const EntryPoint& entry : plan.entryPoints) {
    if (entry.name == "corrupt") corrupt = &entry;
    if (entry.name == "train_step") trainSteps.push_back(&entry);
    if (entry.name == "optimizer_step") optimizerStep = &entry;
  }
  if (!corrupt || trainSteps.empty())
    throw InputError(planPath + ": no \"corrupt\" and \"train_step\" entry points (compiled with --mode infer?)");
  if (!optimizerStep)
    throw InputError(planPath + ": no \"optimizer_step\" entry point (compiled before dgemma-compile ran dg-optimizer-step; "
                                "recompile the plan)");
  trainPlan.microBatch = bucketSize(*corrupt, "micro_batch", planPath);
  trainPlan.canvasLength = bucketSize(*corrupt, "canvas_len", planPath);
  for (const EntryPoint* entry : trainSteps) {
    if (bucketSize(*entry, "micro_batch", planPath) != trainPlan.microBatch ||
        bucketSize(*entry, "canvas_len", planPath) != trainPlan.canvasLength)
      throw InputError(planPath + ": entry " + entry->key() + ": its micro_batch and canvas_len differ from corrupt's " +
                       corrupt->key());
    trainPlan.promptLengths.push_back(bucketSize(*entry, "prompt_len", planPath));
    if (!hasName(entry->outputs, "loss") || !hasName(entry->outputs, "diffusion_loss"))
      throw InputError(planPath + ": entry " + entry->key() + ": expected the outputs loss and diffusion_loss");
  }
  std::sort(trainPlan.promptLengths.begin(), trainPlan.promptLengths.end());
  trainPlan.hasEncoderLoss = hasName(trainSteps.front()->outputs, "encoder_loss");

  trainPlan.optimizerStep = static_cast<size_t>(optimizerStep - plan.entryPoints.data());
  for (const NamedBuffer& input : optimizerStep->inputs) {
    if (kOptimizerScalars.count(input.name)) continue;
    if (input.name.rfind(kGradientPrefix, 0) != 0)
      throw InputError(planPath + ": entry optimizer_step: unexpected input " + input.name);
    for (const EntryPoint* entry : trainSteps)
      if (!hasName(entry->outputs, input.name))
        throw InputError(planPath + ": entry optimizer_step takes " + input.name + ", which " + entry->key() + " does not output");
    trainPlan.gradients.push_back(input.name);
  }
  for (const std::string& scalar : kOptimizerScalars)
    if (!hasName(optimizerStep->inputs, scalar))
      throw InputError(planPath + ": entry optimizer_step: missing input " + scalar);
  if (!hasName(optimizerStep->outputs, "grad_norm"))
    throw InputError(planPath + ": entry optimizer_step: missing output grad_norm");
  trainPlan.optimizer = readOptimizerSettings(plan.metadata, planPath);

  for (const Parameter& parameter : plan.parameters)
    (parameter.name.rfind(kOptimizerStatePrefix, 0) == 0 ? trainPlan.optimizerParameters : trainPlan.modelParameters)
        .push_back(parameter.name);
  return trainPlan;
}

}  // namespace dgemma::tool
