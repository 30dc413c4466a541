// Reading an indexed dataset (IndexedFormat.h; docs/pretraining.md, "Indexed datasets"), one that
// dgemma-run preprocess wrote or one from megatron-core (preprocess_data.py, IndexedDatasetBuilder).
// Both files are memory-mapped (only the document indices are copied); the constructor checks the header and every length, pointer and
// document index against the two files' sizes, so that no later read leaves the mapping.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/data/indexed/IndexedFormat.h"

namespace dgemma {

class IndexedDatasetReader {
 public:
  // Opens PREFIX.idx and PREFIX.bin. Throws InputError "PREFIX.idx: FIELD: expected ..., got ..."
  // for a file that is not the MMIDIDX layout (magic, version, an integer dtype code, sizes that add
  // up to the file's, document indices rising from 0 to the sequence count) or whose sequences do
  // not lie inside PREFIX.bin; "PATH: cannot read: ..." for a missing file.
  explicit IndexedDatasetReader(const std::string& prefix);
  ~IndexedDatasetReader();
  IndexedDatasetReader(IndexedDatasetReader&&) noexcept;
  IndexedDatasetReader& operator=(IndexedDatasetReader&&) noexcept;

  const std::string& prefix() const { return prefix_; }
  TokenDType dtype() const { return dtype_; }
  int64_t sequenceCount() const { return sequenceCount_; }
  int64_t sequenceLength(int64_t sequence) const;
  // megatron-core's document_indices: 0, then the sequence count after each document; documents are
  // documentIndices().size() - 1.
  const std::vector<int64_t>& documentIndices() const { return documentIndices_; }
  int64_t documentCount() const { return static_cast<int64_t>(documentIndices_.size()) - 1; }
  // Appends tokens [offset, offset + length) of a sequence, widened to int64, to `out`. Throws
  // InputError naming the prefix for a sequence or a range outside the dataset.
  void readTokens(int64_t sequence, int64_t offset, int64_t length, std::vector<int64_t>& out) const;
  // The ids the dtype can hold are below this (65,536 for uint16): a model whose vocabulary is
  // smaller must still check each token (docs/pretraining.md).
  int64_t vocabularyLimit() const { return tokenDTypeLimit(dtype_); }
  // Whether the index has the multimodal variant's int8 mode per sequence, and a sequence's mode.
  bool hasSequenceModes() const { return sequenceModes_ != nullptr; }
  int8_t sequenceMode(int64_t sequence) const;

 private:
  class Mapping;

  void checkSequence(int64_t sequence) const;
  int64_t sequencePointer(int64_t sequence) const;

  std::string prefix_;
  std::unique_ptr<Mapping> index_, data_;  // PREFIX.idx, PREFIX.bin
  TokenDType dtype_ = TokenDType::Int32;
  int64_t tokenBytes_ = 4;
  int64_t sequenceCount_ = 0;
  // Into the index's mapping. The arrays start at odd offsets (the header is 34 bytes), so their
  // elements are read with memcpy, never through a typed pointer.
  const char* sequenceLengths_ = nullptr;
  const char* sequencePointers_ = nullptr;
  const char* sequenceModes_ = nullptr;  // null: no modes
  std::vector<int64_t> documentIndices_;
};

}  // namespace dgemma
