// A Megatron indexed dataset (PREFIX.bin + PREFIX.idx, runtime/data/indexed) as the token documents
// of a pre-training dataset (docs/pretraining.md, "Packed sequences and blends"): one sequence per
// document, the index caches beside the files.
#pragma once

#include <string>

#include "runtime/data/indexed/IndexedDataset.h"
#include "runtime/data/pretrain/TokenDocuments.h"

namespace dgemma {

class IndexedDocuments final : public TokenDocuments {
 public:
  // Throws InputError naming PREFIX.idx or PREFIX.bin for a missing, truncated or corrupt file.
  explicit IndexedDocuments(const std::string& prefix) : reader_(prefix) {}

  int64_t sequenceCount() const override { return reader_.sequenceCount(); }
  int64_t sequenceLength(int64_t sequence) const override { return reader_.sequenceLength(sequence); }
  void readTokens(int64_t sequence, int64_t offset, int64_t length, std::vector<int64_t>& out) const override {
    out.clear();
    reader_.readTokens(sequence, offset, length, out);
  }
  // The index arrays depend only on the document lengths, which every cache key folds in.
  std::string identity() const override { return reader_.prefix(); }
  std::string cachePrefix() const override { return reader_.prefix(); }
  // The largest token id the file's dtype holds, plus one.
  int64_t vocabularyLimit() const { return reader_.vocabularyLimit(); }

 private:
  IndexedDatasetReader reader_;
};

}  // namespace dgemma
