// The training loop of `dgemma-run train` (docs/training.md, "The training loop"). Per optimizer step,
// N micro-batches of the global item order run the plan's corrupt and train_step entries (train_step_images for
// an image micro-batch: docs/data.md, "Item order"), which sum
// their gradients into the plan's device buffers; a NaN/Inf guard looks at the losses and, through
// gradient_check, at the sums; optimizer_step applies AdamW at the step's learning rate. Metrics, TensorBoard, the progress line, evaluations and checkpoints
// follow. On several ranks every rank reads the same global batch and runs the same loop on its
// plan; the losses come back whole, and the ranks agree on NaN decisions and checkpoint commits. Everything a step computes is a pure function of (seed, step, consumed samples, the state
// in the checkpoint), so a resumed run continues bit-exactly.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/session/Session.h"

namespace dgemma {

struct TrainOptions {
  SessionOptions session;    // --plan, --weights | --init random, --seed, --backend, --threads
  std::string train;
  std::string validation;
  std::string test;
  // A pre-training plan's data instead (docs/pretraining.md, "Training"): Megatron's --data-path
  // words ("PREFIX" or "W1 PREFIX1 W2 PREFIX2 ..."), the --split of every source's documents into
  // train, validation and test parts, and where the index caches go (empty: beside the data).
  std::vector<std::string> dataPath;
  std::string split = "969,30,1";
  std::string dataCacheDir;
  std::string tokenizer;     // default: the --weights directory
  int64_t steps = 0;         // 0: not given (then the plan's preset must give it)
  double maxSeconds = 0;  // > 0: the last step is the one that reaches this wall-clock budget
  int64_t accumulation = 1;  // micro-batches per optimizer step
  double lr = 5e-5;          // the schedule's peak (docs/training.md)
  double minLr = 0.0;
  int64_t warmupSteps = 0;
  int64_t decaySteps = 0;    // 0: --steps
  std::string decayStyle = "cosine";
  std::string saveDir;
  int64_t saveEvery = 0;     // 0: only at the end
  int keep = 0;              // 0: keep every checkpoint
  bool resume = false;        // continue from the newest checkpoint in saveDir, never an older one
  std::string resumeFrom;    // --resume-from DIR: continue from this checkpoint directory instead
  bool overwrite = false;    // --overwrite: a fresh run deletes another run's checkpoints in saveDir
  // Who this run is, as saveDir records it (SaveDirectoryClaim.h); empty: a fresh identity.
  std::string runIdentity;
  std::string metrics;
  std::string tensorboard;
  int64_t evalEvery = 0;     // 0: only at the end
  int64_t evalBatches = 0;   // 0: the whole split
  std::string nanPolicy = "abort";
  int64_t logEvery = 0;      // progress lines off a terminal: every this many steps too
  bool skipBadRows = false;
  // On a terminal, redraw the progress line in place; false: whole lines whatever stdout is (a
  // launcher relays this rank's stdout).
  bool progressInPlace = true;
  // What fills a last block's canvas after its EOS (docs/training.md, "One training step"): "pad"
  // (Megatron Bridge: pad ids, attended, not scored) or "eos_fill" (Google's recipe: EOS, scored).
  std::string canvasTail = "pad";
};

// `plan` is this rank's of the --plan directory, its run defaults already applied to `options`;
// the session opened for it (openSession) gives the rank its communicators.
int runTrain(const TrainOptions& options, Plan plan);

// The same on a session already open: this rank's plan, its weights and one communicator per mesh
// axis (how several ranks train in one process, e.g. a test's threads over Gloo). Every rank of the
// plan's world runs it with the same options; rank 0 alone prints and writes metrics, TensorBoard
// and checkpoint manifests.
int runTrain(const TrainOptions& options, Session& session);

}  // namespace dgemma
