#include "runtime/data/pretrain/SampleBatches.h"

#include <string>

#include "support/Error.h"

namespace dgemma {

std::vector<int64_t> rankMicroBatchSamples(const SampleBatchLayout& layout, int64_t consumedSamples, int64_t micro,
                                           int64_t rank) {
  if (layout.dataParallel < 1)
    throw InputError("data parallel size: expected at least 1, got " + std::to_string(layout.dataParallel));
  if (layout.microBatch < 1 || layout.microBatch % layout.dataParallel != 0)
    throw InputError("micro-batch: expected a positive multiple of the data parallel size " +
                     std::to_string(layout.dataParallel) + ", got " + std::to_string(layout.microBatch));
  if (layout.accumulation < 1)
    throw InputError("gradient accumulation: expected at least 1 micro-batch, got " +
                     std::to_string(layout.accumulation));
  if (micro < 0 || micro >= layout.accumulation)
    throw InputError("micro-batch index: expected 0 to " + std::to_string(layout.accumulation - 1) + ", got " +
                     std::to_string(micro));
  if (rank < 0 || rank >= layout.dataParallel)
    throw InputError("data parallel rank: expected 0 to " + std::to_string(layout.dataParallel - 1) + ", got " +
                     std::to_string(rank));
  if (consumedSamples < 0 || consumedSamples % layout.microBatch != 0)
    throw InputError("consumed_samples: expected a non-negative multiple of the micro-batch " +
                     std::to_string(layout.microBatch) + ", got " + std::to_string(consumedSamples));
  const int64_t rows = layout.microBatch / layout.dataParallel;
  const int64_t first = consumedSamples + micro * layout.microBatch + rank * rows;
  std::vector<int64_t> samples(static_cast<size_t>(rows));
  for (int64_t row = 0; row < rows; ++row) samples[row] = first + row;
  return samples;
}

}  // namespace dgemma
