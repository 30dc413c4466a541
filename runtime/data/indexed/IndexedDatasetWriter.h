// Writing an indexed dataset (IndexedFormat.h; docs/pretraining.md, "Indexed datasets") as
// megatron-core's IndexedDatasetBuilder does: sequences of tokens appended one by one, documents
// closed by endDocument(), the index written at the end. The tokens stream to PREFIX.bin through a
// temporary file; the lengths, pointers and document indices (16 bytes a sequence) stay in memory
// until finish(). Nothing appears at PREFIX.bin or PREFIX.idx before finish(): a writer destroyed
// without it (an error on the way) leaves neither file behind, and an existing pair is untouched.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "runtime/data/indexed/IndexedFormat.h"
#include "support/AtomicFile.h"

namespace dgemma {

class IndexedDatasetWriter {
 public:
  // `withSequenceModes`: the multimodal variant, one int8 mode per sequence after the document
  // indices. Throws InputError for a float dtype and as AtomicFileWriter does for the paths.
  IndexedDatasetWriter(const std::string& prefix, TokenDType dtype, bool withSequenceModes = false);

  // Appends one sequence to the open document. Throws InputError "PREFIX.bin: sequence N: token id X
  // at position P does not fit uint16 ([0, 65536))" and for a sequence longer than int32 counts.
  void addSequence(std::span<const int32_t> tokens, int8_t mode = 0);
  void addSequence(std::span<const int64_t> tokens, int8_t mode = 0);
  // Closes the open document (an empty one too: megatron-core's preprocess_data.py writes one for
  // a row whose text has no tokens).
  void endDocument();
  // Closes a document left open, writes PREFIX.idx and commits PREFIX.bin, then PREFIX.idx.
  void finish();

  int64_t sequenceCount() const { return static_cast<int64_t>(sequenceLengths_.size()); }
  int64_t documentCount() const { return static_cast<int64_t>(documentIndices_.size()) - 1; }
  int64_t tokenCount() const { return tokenCount_; }

 private:
  template <typename Token>
  void appendSequence(std::span<const Token> tokens, int8_t mode);
  void flushData();

  std::string prefix_;
  TokenDType dtype_;
  int64_t tokenBytes_;
  bool withSequenceModes_;
  AtomicFileWriter data_;
  std::string pending_;  // encoded tokens not yet written to PREFIX.bin
  int64_t tokenCount_ = 0;
  std::vector<int32_t> sequenceLengths_;
  std::vector<int8_t> sequenceModes_;
  std::vector<int64_t> documentIndices_{0};
  bool finished_ = false;
};

}  // namespace dgemma
