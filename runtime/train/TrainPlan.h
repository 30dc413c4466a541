// What `dgemma-run train` needs to know about a training plan (dgemma-compile --mode train), read
// and checked once before anything runs: the entry points' buckets, the optimizer's settings and
// which parameters are the model, which the optimizer's state and which the gradient buffers
// (docs/training.md, "The training loop").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/Plan.h"
#include "runtime/data/image/Image.h"

namespace dgemma {

// The rows [first, first + count) of the global micro-batch that a rank's plan takes.
struct BatchRows {
  int64_t first = 0;
  int64_t count = 0;

  bool operator==(const BatchRows&) const = default;
};

// What a plan's train_step computes (docs/training.md, docs/pretraining.md "Objectives"): the
// block-diffusion objective over chat rows (with its corrupt entry), or a pre-training objective
// over packed documents. The pre-training ones are told apart by their steps: labels for the
// autoregressive step; noise keys and a canvas_len bucket dimension (its block length) for block
// diffusion on packed text; noise keys without one for masked diffusion.
enum class TrainObjective { BlockDiffusion, Autoregressive, MaskedDiffusion, PackedBlockDiffusion };
// "block-diffusion", "autoregressive", "masked-diffusion", "block-diffusion on packed text".
const char* trainObjectiveName(TrainObjective objective);

struct TrainPlan {
  TrainObjective objective = TrainObjective::BlockDiffusion;
  int64_t microBatch = 0;  // the global micro-batch (--micro-batch × DP): the rows every rank reads
  // This rank's rows of it: all of them on one rank; on a data-parallel plan the rows its corrupt and
  // train_step inputs' boxes hold (every batch input split by rows alike).
  BatchRows rankRows;
  int64_t canvasLength = 0;  // the canvas (block diffusion on packed text: the block length)
  std::vector<int64_t> promptLengths;  // the train_step buckets, ascending (block diffusion)
  std::vector<int64_t> sequenceLengths;  // the train_step buckets, ascending (pre-training)
  // The image twins' images_per_example; 0 for a text-only plan (no train_step_images entries).
  int64_t imagesPerExample = 0;
  Gemma4ImageOptions image;            // the model config's processor options (image plans)
  int64_t padId = 0;                   // the model config's text_config.pad_token_id
  int64_t bosId = 0;
  int64_t eosId = 0;                   // the first of the config's EOS ids
  int64_t vocabSize = 0;
  bool hasEncoderLoss = false;         // train_step outputs encoder_loss
  // Indices in Plan::entryPoints.
  size_t optimizerStep = 0;
  size_t gradientCheck = 0;  // outputs "nonfinite/grad/<name>" per gradient buffer
  size_t zeroGradients = 0;
  OptimizerSettings optimizer;  // the plan's
  // Parameters, each list in plan order. The gradient buffers ("grad/<name>") are summed into by
  // train_step, read and zeroed by optimizer_step: zero at every step boundary, so never saved.
  std::vector<std::string> gradients;
  // Every parameter not under "optimizer/", "grad/" or run state; of an adapter plan only the
  // trainable ones (the adapters).
  std::vector<std::string> modelParameters;
  std::vector<std::string> optimizerParameters;  // "optimizer/exp_avg/<name>", ...
};

// What a checkpoint of this training run records and a resumed run must match, whatever the layout
// of either (docs/training.md, "The training loop": resume): the model config, the objective and precision
// dgemma-compile recorded, the optimizer settings and the global shape and dtype of every saved
// parameter (model and optimizer state; the gradient buffers are not saved).
nlohmann::json checkpointIdentity(const Plan& plan, const TrainPlan& trainPlan);

// Throws InputError naming `planPath` and what is missing: a plan compiled with --mode infer, or one
// without the optimizer_step, gradient_check and zero_gradients entries or the gradient buffers; or
// what the trainer cannot feed: batch inputs split on another dimension than the rows, or split
// into different rows, or some split and some whole.
TrainPlan readTrainPlan(const Plan& plan, const std::string& planPath);

}  // namespace dgemma
