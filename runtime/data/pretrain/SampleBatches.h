// Which global samples a rank feeds (docs/pretraining.md, "Micro-batches and resume"). The
// SFT trainer's convention (runtime/train/Trainer.cpp, docs/parallelism.md): a plan is built for
// the global micro-batch B (every data-parallel rank's rows; `--micro-batch` × DP), a step runs A
// micro-batches, so the global batch is B · A; micro-batch m of the step that starts after
// `consumed` samples holds global samples [consumed + m·B, consumed + (m+1)·B), and data-parallel
// rank r of D feeds its box of them, rows [r·B/D, (r+1)·B/D). The samples a step reads are therefore
// the same under any D, and a resume needs only the consumed-samples count.
#pragma once

#include <cstdint>
#include <vector>

namespace dgemma {

struct SampleBatchLayout {
  int64_t microBatch = 1;        // B, the global micro-batch: a multiple of dataParallel
  int64_t accumulation = 1;      // A, micro-batches per step
  int64_t dataParallel = 1;      // D
  int64_t globalBatch() const { return microBatch * accumulation; }
};

// The global sample indices that data-parallel rank `rank` feeds in micro-batch `micro` (0 <= micro
// < A) of the step that starts after `consumedSamples` samples (a multiple of B, as every step
// boundary is under any layout of the same global batch). Throws InputError naming the value out of
// range.
std::vector<int64_t> rankMicroBatchSamples(const SampleBatchLayout& layout, int64_t consumedSamples, int64_t micro,
                                           int64_t rank);

}  // namespace dgemma
