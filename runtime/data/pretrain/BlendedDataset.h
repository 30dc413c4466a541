// Several sources blended by weight (docs/pretraining.md, "Blends"): Megatron's
// `--data-path 0.7 A 0.3 B`. Global sample i is a pure function of (sources, weights, split, S,
// seed, number of samples, i): nothing depends on the ranks that read it or where a run stopped.
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/data/pretrain/DocumentSplit.h"
#include "runtime/data/pretrain/PackedDataset.h"
#include "runtime/data/pretrain/TokenDocuments.h"

namespace dgemma {

struct BlendSource {
  std::shared_ptr<const TokenDocuments> documents;
  double weight = 1;  // > 0; normalized over the sources
};

struct BlendOptions {
  int64_t sequenceLength = 0;  // S
  uint64_t seed = 0;
  int64_t numSamples = 0;      // N: the blend's samples (a run's train samples)
  SplitWeights split;          // applied to each source's documents
  SplitPart part = SplitPart::Train;
  std::string cacheDirectory;  // as PackedDatasetOptions::cacheDirectory
};

// The greedy blend order of N samples over the normalized weights, megatron-core's
// build_blending_indices: sample i goes to the source k with the largest w_k · max(i, 1) − taken_k
// (taken_k: its samples among the first i), the lowest k on a tie, and is that source's sample
// taken_k. Returns the sources, [N].
std::vector<int64_t> greedyBlendOrder(const std::vector<double>& normalizedWeights, int64_t numSamples);

class BlendedDataset {
 public:
  // Opens every source's packed dataset (its split part, ceil(ceil(N · w_k) · 1.005) samples, or more
  // when the blend order takes more) and the blend order, from their caches or built. Throws InputError for
  // no sources, a weight that is not > 0, or a source whose split part holds no tokens.
  BlendedDataset(const std::vector<BlendSource>& sources, const BlendOptions& options, std::ostream* log);

  int64_t size() const { return static_cast<int64_t>(sourceOf_.size()); }
  // Global sample `index`, 0 <= index < size().
  PackedSample sample(int64_t index) const;
  int64_t sourceAt(int64_t index) const { return sourceOf_.at(index); }
  int64_t sourceSampleAt(int64_t index) const { return sourceSample_.at(index); }

  int64_t sourceCount() const { return static_cast<int64_t>(sources_.size()); }
  const PackedDataset& source(int64_t k) const { return *sources_.at(k); }
  const std::vector<double>& normalizedWeights() const { return weights_; }
  // Whether this open built the blend order (not the sources' indexes: ask those).
  bool builtIndex() const { return builtIndex_; }
  const std::string& cachePath() const { return cachePath_; }
  const std::string& cacheKey() const { return key_; }

 private:
  std::string validate(const IndexArrays& arrays) const;

  std::vector<std::unique_ptr<PackedDataset>> sources_;
  std::vector<double> weights_;
  std::vector<int64_t> sourceOf_;      // [N]
  std::vector<int64_t> sourceSample_;  // [N]
  std::string key_;
  std::string cachePath_;
  bool builtIndex_ = false;
};

}  // namespace dgemma
