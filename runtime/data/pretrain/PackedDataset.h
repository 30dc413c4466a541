// One source's documents packed into fixed-length samples, with Megatron GPTDataset's semantics
// (docs/pretraining.md, "Packed samples"): the split's documents are shuffled per epoch,
// concatenated over as many epochs as the requested samples need, and cut into samples of S + 1
// tokens that overlap by one token; the samples are then shuffled. The index arrays are cached on
// disk (runtime/data/pretrain/IndexCache.h).
#pragma once

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "runtime/data/pretrain/DocumentSplit.h"
#include "runtime/data/pretrain/IndexCache.h"
#include "runtime/data/pretrain/TokenDocuments.h"

namespace dgemma {

// One sample: S + 1 positions. The autoregressive objective feeds [0, S) and predicts [1, S + 1);
// masked diffusion uses [0, S).
struct PackedSample {
  std::vector<int64_t> tokens;
  // 0, 1, 2, ... per document segment of the sample (the intra-document attention mask compares
  // these). Counted per occurrence: a document that follows itself across an epoch boundary is two
  // segments.
  std::vector<int64_t> segmentIds;
  // The token's offset in its document, counted from the document's first token: a document carried
  // over from the previous sample starts above 0 here.
  std::vector<int64_t> positionIds;
  // 1 where the token is its document's last.
  std::vector<uint8_t> endsDocument;
  // The document (sequence number in the source) of each segment.
  std::vector<int64_t> segmentDocuments;
};

// The autoregressive loss mask of a sample, [S]: label k (token k + 1, predicted from token k) counts
// unless token k ends its document, i.e. the label starts another document.
std::vector<float> autoregressiveLossMask(const PackedSample& sample);

struct PackedDatasetOptions {
  int64_t sequenceLength = 0;  // S >= 1
  uint64_t seed = 0;
  int64_t numSamples = 0;      // at least this many samples are built (>= 1)
  DocumentRange documents;     // the split's documents of the source
  // Where the index cache goes; empty: beside the data (TokenDocuments::cachePrefix), no cache when
  // that is empty too.
  std::string cacheDirectory;
};

class PackedDataset {
 public:
  // Loads the index from its cache file or builds (and caches) it. Throws InputError for options out
  // of range or a split without tokens. Messages (a rebuilt cache) go to `log` when not null.
  PackedDataset(std::shared_ptr<const TokenDocuments> source, const PackedDatasetOptions& options, std::ostream* log);

  // Every sample the epochs hold: floor((E · T − 1) / S) >= numSamples, T the split's tokens.
  int64_t size() const { return static_cast<int64_t>(sampleOrder_.size()); }
  int64_t epochs() const { return epochs_; }
  // N, the samples asked for.
  int64_t requestedSamples() const { return options_.numSamples; }
  // Sample `index` (0 <= index < size()) after the sample shuffle.
  PackedSample sample(int64_t index) const;

  // Whether this open built the index (no usable cache file) rather than reading it.
  bool builtIndex() const { return builtIndex_; }
  // The cache file; empty when nothing is cached.
  const std::string& cachePath() const { return cachePath_; }
  const TokenDocuments& source() const { return *source_; }
  // The key text the cache file is named by (and holds).
  const std::string& cacheKey() const { return key_; }

  // The index arrays. Document order: the split's documents, epoch by epoch. Sample starts:
  // (position in the document order, token offset) of sample j's first token, j = 0 ... size(),
  // flattened. Sample order: the sample shuffle.
  const std::vector<int64_t>& documentOrder() const { return documentOrder_; }
  const std::vector<int64_t>& sampleStarts() const { return sampleStarts_; }
  const std::vector<int64_t>& sampleOrder() const { return sampleOrder_; }

 private:
  void build();
  std::string validate(const IndexArrays& arrays) const;

  std::shared_ptr<const TokenDocuments> source_;
  PackedDatasetOptions options_;
  std::vector<int64_t> lengths_;  // of the split's documents, by document - begin
  int64_t tokensPerEpoch_ = 0;
  int64_t epochs_ = 0;
  int64_t samples_ = 0;
  std::string key_;
  std::string cachePath_;
  bool builtIndex_ = false;
  std::vector<int64_t> documentOrder_;
  std::vector<int64_t> sampleStarts_;
  std::vector<int64_t> sampleOrder_;
};

}  // namespace dgemma
