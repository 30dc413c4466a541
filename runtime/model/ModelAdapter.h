// The one place where the runtime meets a model family (docs/architecture.md, "The model
// boundary"). A plan records its family (plan.modelFamily); everything the runtime's generic parts
// (sessions, the trainer, the generator, dgemma-run's commands) must know about that model goes
// through its adapter: the names of its entry points and fields, how its checkpoints map onto the
// plan's parameters, the defaults and checks of its batches, and the files that make a checkpoint a
// model directory of the family's HF library. Only the adapters under runtime/model/<family>/ name
// a model's tensors, entries or fields.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "plan/Plan.h"
#include "runtime/core/HostTensor.h"
#include "runtime/data/batch/Blocks.h"
#include "runtime/data/batch/ImageInputs.h"
#include "runtime/data/image/Image.h"

namespace dgemma {

class Executor;

// The names of the entry points and fields that the runtime's generic parts feed and read. A
// family without an entry leaves its name empty.
struct ModelContract {
  // Entry points.
  std::string forwardEntry;          // dgemma-run forward
  std::string trainStepEntry;        // the training step: loss and gradients
  std::string imageTrainStepEntry;   // its image twin
  std::string corruptEntry;          // draws a training batch's corruption
  std::string logpsEntry;            // GRPO: the policy's per-example log-probabilities, no gradient
  std::string imageLogpsEntry;       // its image twin
  std::string prefillEntry;          // generation: encodes the prompt into the cache
  std::string imagePrefillEntry;     // its image twin
  std::string denoiseEntry;          // generation: one decoder pass over the canvas
  std::string firstDenoiseEntry;     // the first pass of a canvas, when it differs
  std::string commitEntry;           // generation: appends a finished canvas to the cache
  std::string packedLogitsEntry;     // a pre-training inference plan's logits of packed rows

  // Bucket dimensions.
  std::string microBatchDimension;
  std::string promptLengthDimension;
  std::string canvasLengthDimension;
  std::string sequenceLengthDimension;  // a pre-training train_step's packed length

  // The collated batch (docs/data.md, "Collated batch") and the image batch.
  CollatedFieldNames batch;
  ImageFieldNames images;

  // Corruption and self-conditioning (docs/training.md, "Uniform-state corruption"): the corrupt
  // entry's noise keys input and its outputs, which the training step and the generation read.
  std::string noiseKeys, noisyCanvasIds, diffusionTime, selfConditioningMask;

  // The training step's outputs besides the gradients.
  std::string loss, diffusionLoss, encoderLoss;

  // A pre-training step's inputs besides input_ids, position_ids and noise_keys
  // (docs/pretraining.md, "Objectives"): packed documents' ids, the autoregressive labels and the
  // scored positions.
  std::string documentIds, labels, lossMask;
  // The soft-capped logits that packedLogitsEntry (and forward) output.
  std::string logits;

  // The GRPO training step's inputs and outputs besides the SFT ones (docs/rl.md); logps is also
  // the logps entry's output.
  std::string advantages, oldLogps, refLogps, logps, clipped, klTerm;

  // The generation entries' fields (docs/inference-plan.md).
  std::string positions, blockIds, cacheValid, frozen, writeRows, temperature, sampleKeys;
  std::string sampledIds, argmaxIds, entropy;
};

// What the trainer and the generator read from the plan's model config.
struct ModelTokens {
  int64_t padId = 0;
  int64_t bosId = 0;
  int64_t eosId = 0;  // the first of the config's EOS ids
  int64_t vocabSize = 0;
};

class ModelAdapter {
 public:
  virtual ~ModelAdapter() = default;

  virtual const ModelContract& contract() const = 0;

  // Fills the executor's model parameters from `weightsPath` (a checkpoint directory or file);
  // `planPath` names the plan in messages. The LoRA adapters of an adapter plan are no part of a
  // base checkpoint: they are left as they are, for initializeWeights or loadAdapter.
  virtual void loadWeights(Executor& executor, const std::string& weightsPath, const std::string& planPath) const = 0;

  // LoRA adapters (docs/training.md, "LoRA adapters"), of a plan with `adapter` settings.
  // Whether plan parameter `name` is an adapter.
  virtual bool isAdapterParameter(const std::string& name) const = 0;
  // The files of the family's adapter directory (file name, bytes) for `tensors`, every adapter
  // parameter's global tensor; `baseModel` names the base they were trained over.
  virtual std::vector<std::pair<std::string, std::string>> adapterFiles(
      const Plan& plan, const std::map<std::string, HostTensor>& tensors, const std::string& baseModel) const = 0;
  // Every adapter parameter's global tensor (f32) from adapter directory `directory`. InputError
  // naming it when the plan has no adapter or the directory's settings, keys or shapes differ.
  virtual std::map<std::string, HostTensor> readAdapter(const Plan& plan, const std::string& directory) const = 0;
  // The settings (rank, alpha, targets) of adapter directory `directory`, to compile a plan that
  // takes it; InputError naming it when it is no adapter of the family.
  virtual AdapterSettings adapterSettings(const std::string& directory) const = 0;

  // The token ids and vocabulary of the plan's model config; InputError naming `planPath` when the
  // family has none or the config lacks them.
  virtual ModelTokens tokens(const Plan& plan, const std::string& planPath) const = 0;
  // The image processor options of the plan's model config (docs/data.md, "Image preprocessing").
  virtual Gemma4ImageOptions imageOptions(const Plan& plan, const std::string& planPath) const = 0;

  // Adds the inputs of `entry` that a batch may leave out (forward's optional fields) to `batch`.
  virtual void addEntryDefaults(std::map<std::string, HostTensor>& batch, const EntryPoint& entry,
                                const Plan& plan) const = 0;
  // Checks a batch file's tensors against the model (token ids inside the vocabulary); InputError
  // naming `batchPath`, the tensor and the element.
  virtual void checkBatch(const std::map<std::string, HostTensor>& batch, const Plan& plan,
                          const std::string& batchPath) const = 0;

  // The files a checkpoint writes beside its weights so that the family's HF library opens it, as
  // (file name, bytes); none for a family without one.
  virtual std::vector<std::pair<std::string, std::string>> checkpointSideFiles(
      const Plan& plan, const std::string& tokenizerDir) const = 0;
  // The name under which the HF checkpoint stores a second copy of model parameter `name`, if it does.
  virtual std::optional<std::string> secondCopyName(const std::string& name) const = 0;
};

// The adapter of the plan's model family.
const ModelAdapter& modelAdapterFor(ModelFamily family);

}  // namespace dgemma
