// A parallel layout for DiffusionGemma and the constraints the model puts on it (docs/parallelism.md,
// "Meshes" and "Divisibility"): world = CP x TP x DP = CP x EDP x EP with EP dividing DP; TP divides
// every layer's query heads and the dense MLP width (the vocabulary is padded instead); a layer's KV
// heads are a multiple of TP or divide it (then each is replicated on TP / heads ranks), and the KV
// head counts below TP divide one another; EP divides the experts; with sequence parallelism TP
// divides every prompt bucket and the canvas; 2 x CP (times TP under SP) divides every prompt bucket
// and the canvas ("Context parallelism"). Checked before anything is built, so that an impossible
// layout is named by the constraint it breaks rather than failing somewhere in the partitioner.
#pragma once

#include <cstdint>
#include <vector>

#include "models/diffusion_gemma/spec/Config.h"

namespace dgemma {

struct ParallelLayout {
  int64_t tensorParallel = 1;    // --tp
  int64_t dataParallel = 1;      // --dp
  int64_t expertParallel = 1;    // --ep
  bool sequenceParallel = false; // --sp
  int64_t contextParallel = 1;   // --cp

  int64_t worldSize() const { return contextParallel * tensorParallel * dataParallel; }
  // The expert mesh's data-parallel size: world = CP x EDP x EP (expert tensor parallelism is 1;
  // the context ranks hold other tokens, so they count as expert-data ranks for the reduction).
  int64_t expertDataParallel() const { return worldSize() / expertParallel; }
};

// The embedding rows a plan holds (docs/parallelism.md, "Vocabulary padding"): the vocabulary rounded up
// to a multiple of lcm(TP, alignment), as Megatron's make_vocab_size_divisible_by x TP; equal to
// `vocabSize` when that multiple divides it, so an unpadded plan is unchanged.
int64_t paddedVocabularySize(int64_t vocabSize, int64_t tensorParallel, int64_t alignment);

// Throws InputError naming the flag, the constraint and the sizes involved when `layout` cannot
// shard this model at these shapes (prompt-length buckets and canvas length, in tokens).
void checkParallelLayout(const DiffusionGemmaConfig& config, const ParallelLayout& layout,
                         const std::vector<int64_t>& promptLengths, int64_t canvasLength);

}  // namespace dgemma
