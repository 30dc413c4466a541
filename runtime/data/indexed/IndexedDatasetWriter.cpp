#include "runtime/data/indexed/IndexedDatasetWriter.h"

#include <bit>
#include <cstring>
#include <limits>

#include "support/Error.h"

namespace dgemma {

static_assert(std::endian::native == std::endian::little, "the indexed format is little-endian; so is this code");

namespace {

// Large enough that PREFIX.bin is written in few system calls.
constexpr size_t kDataFlushBytes = size_t{1} << 20;

template <typename Stored>
void appendEncoded(std::string& bytes, int64_t value) {
  const Stored stored = static_cast<Stored>(value);
  bytes.append(reinterpret_cast<const char*>(&stored), sizeof stored);
}

template <typename Value>
void appendArray(std::string& bytes, const std::vector<Value>& values) {
  bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(Value));
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, TokenDType dtype, bool withSequenceModes)
    : prefix_(prefix),
      dtype_(dtype),
      tokenBytes_(tokenDTypeBytes(dtype)),
      withSequenceModes_(withSequenceModes),
      data_(dataPath(prefix)) {
  if (!integerTokenDType(static_cast<uint8_t>(dtype)))
    throw InputError(dataPath(prefix) + ": expected an integer token dtype, got " + tokenDTypeName(dtype));
}

void IndexedDatasetWriter::addSequence(std::span<const int32_t> tokens, int8_t mode) { appendSequence(tokens, mode); }
void IndexedDatasetWriter::addSequence(std::span<const int64_t> tokens, int8_t mode) { appendSequence(tokens, mode); }

template <typename Token>
void IndexedDatasetWriter::appendSequence(std::span<const Token> tokens, int8_t mode) {
  const std::string where = dataPath(prefix_) + ": sequence " + std::to_string(sequenceCount());
  if (tokens.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    throw InputError(where + ": expected at most 2147483647 tokens (sequence_lengths are int32), got " +
                     std::to_string(tokens.size()));
  const int64_t minimum = tokenDTypeMinimum(dtype_), limit = tokenDTypeLimit(dtype_);
  const bool holdsEveryId = dtype_ == TokenDType::Int64;
  for (size_t position = 0; position < tokens.size() && !holdsEveryId; ++position) {
    const int64_t token = tokens[position];
    if (token < minimum || token >= limit)
      throw InputError(where + ": token id " + std::to_string(token) + " at position " + std::to_string(position) +
                       " does not fit " + tokenDTypeName(dtype_) + " ([" + std::to_string(minimum) + ", " +
                       std::to_string(limit) + "))");
  }
  for (const Token token : tokens) {
    switch (dtype_) {
      case TokenDType::UInt8: appendEncoded<uint8_t>(pending_, token); break;
      case TokenDType::Int8: appendEncoded<int8_t>(pending_, token); break;
      case TokenDType::Int16: appendEncoded<int16_t>(pending_, token); break;
      case TokenDType::UInt16: appendEncoded<uint16_t>(pending_, token); break;
      case TokenDType::Int32: appendEncoded<int32_t>(pending_, token); break;
      case TokenDType::Int64: appendEncoded<int64_t>(pending_, token); break;
      case TokenDType::Float32:
      case TokenDType::Float64: break;  // refused by the constructor
    }
  }
  sequenceLengths_.push_back(static_cast<int32_t>(tokens.size()));
  if (withSequenceModes_) sequenceModes_.push_back(mode);
  tokenCount_ += static_cast<int64_t>(tokens.size());
  if (pending_.size() >= kDataFlushBytes) flushData();
}

void IndexedDatasetWriter::flushData() {
  data_.append(pending_);
  pending_.clear();
}

void IndexedDatasetWriter::endDocument() { documentIndices_.push_back(sequenceCount()); }

void IndexedDatasetWriter::finish() {
  if (finished_) throw std::logic_error(prefix_ + ": IndexedDatasetWriter::finish called twice");
  finished_ = true;
  if (documentIndices_.back() != sequenceCount()) endDocument();
  flushData();

  std::vector<int64_t> sequencePointers;
  sequencePointers.reserve(sequenceLengths_.size());
  int64_t pointer = 0;
  for (const int32_t length : sequenceLengths_) {
    sequencePointers.push_back(pointer);
    pointer += int64_t{length} * tokenBytes_;
  }
  std::string index;
  index.reserve(static_cast<size_t>(kIndexHeaderBytes) + sequenceLengths_.size() * 13 + documentIndices_.size() * 8);
  index.append(kIndexMagic);
  appendEncoded<uint64_t>(index, static_cast<int64_t>(kIndexVersion));
  appendEncoded<uint8_t>(index, static_cast<int64_t>(dtype_));
  appendEncoded<uint64_t>(index, sequenceCount());
  appendEncoded<uint64_t>(index, static_cast<int64_t>(documentIndices_.size()));
  appendArray(index, sequenceLengths_);
  appendArray(index, sequencePointers);
  appendArray(index, documentIndices_);
  if (withSequenceModes_) appendArray(index, sequenceModes_);

  // The index goes last: a reader that finds the new PREFIX.idx finds the PREFIX.bin it describes.
  AtomicFileWriter indexFile(indexPath(prefix_));
  indexFile.append(index);
  data_.commit();
  indexFile.commit();
}

}  // namespace dgemma
