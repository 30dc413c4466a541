#include "runtime/model/diffusion_gemma/DiffusionGemmaAdapter.h"

#include <algorithm>
#include <iostream>
#include <set>

#include "models/diffusion_gemma/spec/Config.h"
#include "models/diffusion_gemma/spec/Interface.h"
#include "models/diffusion_gemma/spec/WeightSchema.h"
#include "runtime/exec/Executor.h"
#include "runtime/exec/WeightLoader.h"
#include "runtime/io/Safetensors.h"
#include "runtime/model/diffusion_gemma/HfExport.h"
#include "runtime/model/diffusion_gemma/PeftAdapter.h"
#include "runtime/session/GlobalTensors.h"
#include "support/Error.h"

namespace dgemma {

namespace {

namespace names = diffusion_gemma;

ModelContract diffusionGemmaContract() {
  ModelContract contract;
  contract.forwardEntry = names::kForwardEntry;
  contract.trainStepEntry = names::kTrainStepEntry;
  contract.imageTrainStepEntry = names::kTrainStepImagesEntry;
  contract.corruptEntry = names::kCorruptEntry;
  contract.logpsEntry = names::kLogpsEntry;
  contract.imageLogpsEntry = names::kLogpsImagesEntry;
  contract.prefillEntry = names::kPrefillEntry;
  contract.imagePrefillEntry = names::kPrefillImagesEntry;
  contract.denoiseEntry = names::kDenoiseEntry;
  contract.firstDenoiseEntry = names::kDenoiseFirstEntry;
  contract.commitEntry = names::kCommitEntry;
  contract.packedLogitsEntry = names::kPackedLogitsEntry;
  contract.microBatchDimension = names::kMicroBatchDimension;
  contract.promptLengthDimension = names::kPromptLengthDimension;
  contract.canvasLengthDimension = names::kCanvasLengthDimension;
  contract.sequenceLengthDimension = names::kSequenceLengthDimension;
  contract.batch = {names::kInputIds,     names::kAttentionMask, names::kPositionIds,
                    names::kTokenTypeIds, names::kCanvasIds,     names::kCanvasMask};
  contract.images = {names::kPixelValues,   names::kImagePositionIds, names::kTokenTypeIds,
                     names::kImagePoolSlot, names::kImageTokenIndex,  names::kImageSegmentIds};
  contract.noiseKeys = names::kNoiseKeys;
  contract.noisyCanvasIds = names::kNoisyCanvasIds;
  contract.diffusionTime = names::kDiffusionTime;
  contract.selfConditioningMask = names::kSelfConditioningMask;
  contract.loss = names::kLoss;
  contract.diffusionLoss = names::kDiffusionLoss;
  contract.encoderLoss = names::kEncoderLoss;
  contract.documentIds = names::kDocumentIds;
  contract.labels = names::kLabels;
  contract.lossMask = names::kLossMask;
  contract.logits = names::kLogits;
  contract.advantages = names::kAdvantages;
  contract.oldLogps = names::kOldLogps;
  contract.refLogps = names::kRefLogps;
  contract.logps = names::kLogps;
  contract.clipped = names::kClipped;
  contract.klTerm = names::kKlTerm;
  contract.positions = names::kPositions;
  contract.blockIds = names::kBlockIds;
  contract.cacheValid = names::kCacheValid;
  contract.frozen = names::kFrozen;
  contract.writeRows = names::kWriteRows;
  contract.temperature = names::kTemperature;
  contract.sampleKeys = names::kSampleKeys;
  contract.sampledIds = names::kSampledIds;
  contract.argmaxIds = names::kArgmaxIds;
  contract.entropy = names::kEntropy;
  return contract;
}

DiffusionGemmaConfig configOf(const Plan& plan, const std::string& planPath) {
  return parseDiffusionGemmaConfig(plan.modelConfig, planPath + ": model.config");
}

const NamedBuffer* inputNamed(const EntryPoint& entry, const std::string& name) {
  for (const NamedBuffer& input : entry.inputs)
    if (input.name == name) return &input;
  return nullptr;
}

class DiffusionGemmaAdapter final : public ModelAdapter {
 public:
  const ModelContract& contract() const override { return contract_; }

  // Through the checkpoint rules of docs/model.md: either text prefix, tied copies checked equal.
  void loadWeights(Executor& executor, const std::string& weightsPath, const std::string& planPath) const override {
    const Plan& plan = executor.plan();
    const DiffusionGemmaConfig config = configOf(plan, planPath);
    SafetensorsDirectory checkpoint = SafetensorsDirectory::open(weightsPath);
    // A text tensor the plan does not hold may be missing (a pre-training checkpoint has no
    // self-conditioning block); every one it holds must be there.
    std::set<std::string> planParameters;
    for (const Parameter& parameter : plan.parameters) planParameters.insert(parameter.name);
    ResolvedCheckpoint resolved = resolveCheckpointNames(
        config, checkpoint, [&](const std::string& name) { return planParameters.count(name) > 0; });
    // Only a plan with image entries declares the vision parameters (models/diffusion_gemma/ir/Builder.h).
    const bool readsImages = std::any_of(plan.parameters.begin(), plan.parameters.end(), [](const Parameter& parameter) {
      return parameter.name.rfind(kVisionTowerPrefix, 0) == 0;
    });
    if (!resolved.visionTensorNames.empty() && !readsImages)
      std::cerr << "dgemma-run: warning: " << weightsPath << ": " << resolved.visionTensorNames.size()
                << " vision tensors ignored (the plan has no image entries; dgemma-compile --images-per-example)\n";
    loadMappedWeights(
        executor, weightsPath,
        [&](const std::string& name) -> std::optional<SafetensorsLocation> {
          for (const auto* tensors : {&resolved.textTensors, &resolved.visionTensors})
            if (auto found = tensors->find(name); found != tensors->end()) return found->second;
          return std::nullopt;
        },
        {}, [&](const Parameter& parameter) { return plan.adapter && isAdapterParameter(parameter.name); });
  }

  bool isAdapterParameter(const std::string& name) const override { return isLoraParameterName(name); }

  // PEFT's adapter directory (PeftAdapter.h).
  std::vector<std::pair<std::string, std::string>> adapterFiles(const Plan& plan,
                                                                const std::map<std::string, HostTensor>& tensors,
                                                                const std::string& baseModel) const override {
    if (!plan.adapter) throw InputError("the plan has no LoRA adapter (dgemma-compile --lora)");
    return peftAdapterFiles(*plan.adapter, baseModel, tensors);
  }

  AdapterSettings adapterSettings(const std::string& directory) const override {
    return readPeftAdapterSettings(directory);
  }

  std::map<std::string, HostTensor> readAdapter(const Plan& plan, const std::string& directory) const override {
    std::map<std::string, std::vector<int64_t>> expected;
    for (const Parameter& parameter : plan.parameters)
      if (isAdapterParameter(parameter.name)) expected[parameter.name] = parameter.globalShape;
    if (!plan.adapter || expected.empty())
      throw InputError("--adapter: " + directory +
                       ": the plan has no LoRA adapter parameters (compile it with dgemma-compile --lora RANK[:ALPHA] "
                       "--lora-targets LIST, as the adapter was trained)");
    return readPeftAdapterDirectory(directory, *plan.adapter, expected);
  }

  ModelTokens tokens(const Plan& plan, const std::string& planPath) const override {
    const DiffusionGemmaConfig config = configOf(plan, planPath);
    if (config.eosTokenIds.empty()) throw InputError(planPath + ": model.config: no eos_token_id");
    return {config.padTokenId, config.bosTokenId, config.eosTokenIds.front(), config.vocabSize};
  }

  // The config's vision_config patch and pooling sizes and its vision_soft_tokens_per_image (the
  // pipeline's Gemma4ImageOptions = {p, k, T}).
  Gemma4ImageOptions imageOptions(const Plan& plan, const std::string& planPath) const override {
    const DiffusionGemmaConfig config = configOf(plan, planPath);
    Gemma4ImageOptions options;
    options.patchSize = config.vision.patchSize;
    options.poolingKernelSize = config.vision.poolingKernelSize;
    options.maxSoftTokens = config.maxSoftTokensPerImage;
    options.configuredSoftTokens = true;
    return options;
  }

  // forward's optional fields (docs/cli.md, "Batch files"): the decoder input defaults to the canvas
  // ids; without self-conditioning logits the signal is exactly zero, as in transformers, whatever
  // mask the batch carries (the mask only selects rows of given logits); with logits and no mask,
  // every example is conditioned.
  void addEntryDefaults(std::map<std::string, HostTensor>& batch, const EntryPoint& entry,
                        const Plan& plan) const override {
    if (entry.name != names::kForwardEntry) return;
    if (inputNamed(entry, names::kNoisyCanvasIds) && !batch.count(names::kNoisyCanvasIds) &&
        batch.count(names::kCanvasIds))
      batch[names::kNoisyCanvasIds] = batch.at(names::kCanvasIds);
    const NamedBuffer* logits = inputNamed(entry, names::kSelfConditioningLogits);
    const NamedBuffer* mask = inputNamed(entry, names::kSelfConditioningMask);
    if (!logits || !mask) return;
    const bool hasLogits = batch.count(names::kSelfConditioningLogits) != 0;
    if (!hasLogits)
      batch[names::kSelfConditioningLogits] =
          HostTensor(plan.buffers[logits->buffer].dtype, globalShapeOf(*logits, plan));
    if (!hasLogits || !batch.count(names::kSelfConditioningMask)) {
      HostTensor fill(DType::F32, globalShapeOf(*mask, plan));
      std::fill(fill.as<float>(), fill.as<float>() + fill.numElements(), hasLogits ? 1.0f : 0.0f);
      batch[names::kSelfConditioningMask] =
          convertDType(fill, plan.buffers[mask->buffer].dtype, names::kSelfConditioningMask);
    }
  }

  // The fields that hold token ids (docs/cli.md, "Batch files"): every one must index the
  // embedding, so an id outside [0, vocab_size) is the batch's error, named by tensor and index,
  // not a failed gather in some plan step.
  void checkBatch(const std::map<std::string, HostTensor>& batch, const Plan& plan,
                  const std::string& batchPath) const override {
    const int64_t vocabSize = configOf(plan, "--plan").vocabSize;
    for (const char* field : {names::kInputIds, names::kCanvasIds, names::kNoisyCanvasIds}) {
      auto it = batch.find(field);
      if (it == batch.end()) continue;
      const std::string what = batchPath + ": tensor " + field;
      const HostTensor ids = convertDType(it->second, DType::I64, what);
      for (int64_t i = 0; i < ids.numElements(); ++i) {
        const int64_t id = ids.as<int64_t>()[i];
        if (id >= 0 && id < vocabSize) continue;
        std::string index;
        for (size_t d = 0, rest = static_cast<size_t>(i); d < ids.shape.size(); ++d) {
          int64_t stride = 1;
          for (size_t e = d + 1; e < ids.shape.size(); ++e) stride *= ids.shape[e];
          index += (d ? "," : "") + std::to_string(rest / stride);
          rest %= stride;
        }
        throw InputError(what + ": element [" + index + "]: token id " + std::to_string(id) +
                         " is outside the vocabulary [0, " + std::to_string(vocabSize) + ") (the plan's vocab_size)");
      }
    }
  }

  // config.json, generation_config.json and the tokenizer files (docs/training.md, "Checkpoints").
  std::vector<std::pair<std::string, std::string>> checkpointSideFiles(const Plan& plan,
                                                                       const std::string& tokenizerDir) const override {
    return hfSideFiles(plan.modelConfig, plan.modelGenerationConfig, tokenizerDir);
  }

  // HF stores the encoder's layer_scalar buffers beside the decoder's (docs/model.md, "Tying").
  std::optional<std::string> secondCopyName(const std::string& name) const override {
    return untiedEncoderCopyName(name);
  }

 private:
  ModelContract contract_ = diffusionGemmaContract();
};

}  // namespace

const ModelAdapter& diffusionGemmaAdapter() {
  static const DiffusionGemmaAdapter adapter;
  return adapter;
}

}  // namespace dgemma
