// One split of a training run's data as the Trainer reads it (docs/training.md, "The training
// loop"): micro-batches by global index in the seeded training order, one pass in a fixed order for
// an evaluation, and what a checkpoint records of the order. Everything is a function of the split,
// the seed and the index, so a resumed run reads the same samples from its consumed-samples count.
// BlockSplit (TrainData.h) holds chat rows cut into canvas blocks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/core/HostTensor.h"

namespace dgemma {

struct MicroBatch {
  // The train step's inputs, named by the model's contract.
  std::map<std::string, HostTensor> fields;
  bool images = false;                       // runs the image twins (the image train step)
  std::vector<int64_t> samples;             // global sample indices, the noise keys' sample indices
  int64_t tokens = 0;                        // real tokens
  std::string where;                         // "FILE: samples 8..9" for messages
};

class TrainSplit {
 public:
  virtual ~TrainSplit() = default;

  // The split's source as its flag named it, for messages.
  virtual const std::string& path() const = 0;
  // The items the training order cycles over (a resumed run's trajectory must match it).
  virtual int64_t items() const = 0;
  // Micro-batch `index` of the training order: global samples [index·B, (index+1)·B).
  virtual MicroBatch trainingMicroBatch(int64_t index) = 0;
  // One evaluation pass: its number of micro-batches and each of them.
  virtual int64_t evaluationMicroBatches() const = 0;
  virtual MicroBatch evaluationMicroBatch(int64_t index) = 0;
  // What the manifest's data_order_state records after `consumedSamples` samples of the training
  // order; a resume recomputes it and compares.
  virtual nlohmann::json orderState(int64_t consumedSamples) const = 0;
  // The real tokens of the training order's first `consumedSamples` samples (recounted on resume
  // rather than stored). Throws InputError naming `where` when they exceed 2^63.
  virtual int64_t tokensBefore(int64_t consumedSamples, const std::string& where) = 0;
};

}  // namespace dgemma
