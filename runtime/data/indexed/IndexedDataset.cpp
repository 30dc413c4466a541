#include "runtime/data/indexed/IndexedDataset.h"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstring>

#include "support/Error.h"
#include "support/InputFile.h"

namespace dgemma {

static_assert(std::endian::native == std::endian::little, "the indexed format is little-endian; so is this code");

// A regular file mapped read-only for the reader's lifetime; an empty file maps to nothing.
class IndexedDatasetReader::Mapping {
 public:
  explicit Mapping(const std::string& path) {
    RegularFile file(path);
    size_ = file.size();
    if (size_ == 0) return;
    void* address = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, file.fd(), 0);
    if (address == MAP_FAILED) throw RuntimeError(path + ": cannot read: mmap: " + std::strerror(errno));
    bytes_ = static_cast<const char*>(address);
  }
  ~Mapping() {
    if (bytes_ != nullptr) ::munmap(const_cast<char*>(bytes_), size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  const char* bytes() const { return bytes_; }
  uint64_t size() const { return size_; }

 private:
  const char* bytes_ = nullptr;
  uint64_t size_ = 0;
};

namespace {

template <typename Value>
Value load(const char* bytes, int64_t index = 0) {
  Value value;
  std::memcpy(&value, bytes + index * static_cast<int64_t>(sizeof(Value)), sizeof(Value));
  return value;
}

std::string quoteBytes(std::string_view bytes) {
  std::string quoted = "\"";
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte >= 0x20 && byte < 0x7f && c != '"' && c != '\\') {
      quoted += c;
    } else {
      static const char* const kHex = "0123456789abcdef";
      quoted += "\\x";
      quoted += kHex[byte >> 4];
      quoted += kHex[byte & 15];
    }
  }
  return quoted + "\"";
}

}  // namespace

IndexedDatasetReader::IndexedDatasetReader(const std::string& prefix) : prefix_(prefix) {
  const std::string indexFile = indexPath(prefix), dataFile = dataPath(prefix);
  index_ = std::make_unique<Mapping>(indexFile);
  const uint64_t indexSize = index_->size();
  const char* index = index_->bytes();
  auto fail = [&](const std::string& field, const std::string& expected) -> InputError {
    return InputError(indexFile + ": " + field + ": expected " + expected);
  };

  if (indexSize < static_cast<uint64_t>(kIndexHeaderBytes))
    throw fail("header", std::to_string(kIndexHeaderBytes) +
                             " bytes (a Megatron indexed dataset's .idx), got a file of " + std::to_string(indexSize));
  if (std::string_view(index, kIndexMagic.size()) != kIndexMagic)
    throw fail("magic", quoteBytes(kIndexMagic) + " (a Megatron indexed dataset's .idx), got " +
                            quoteBytes(std::string_view(index, kIndexMagic.size())));
  if (const uint64_t version = load<uint64_t>(index + 9); version != kIndexVersion)
    throw fail("version", std::to_string(kIndexVersion) + ", got " + std::to_string(version));
  const uint8_t code = load<uint8_t>(index + 17);
  const std::optional<TokenDType> dtype = integerTokenDType(code);
  if (!dtype) {
    const std::string known = code == 6 || code == 7 ? " (" + tokenDTypeName(static_cast<TokenDType>(code)) + ")" : "";
    throw fail("dtype code", "an integer token dtype (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 8 uint16), got " +
                                 std::to_string(code) + known);
  }
  dtype_ = *dtype;
  tokenBytes_ = tokenDTypeBytes(dtype_);

  // Bounded by the file's size before any arithmetic, so that nothing below overflows.
  const uint64_t sequences = load<uint64_t>(index + 18), documentEntries = load<uint64_t>(index + 26);
  const uint64_t arrayBytes = indexSize - kIndexHeaderBytes;
  if (sequences > arrayBytes / 12)
    throw fail("sequence count", "at most " + std::to_string(arrayBytes / 12) + " for a file of " +
                                     std::to_string(indexSize) + " bytes, got " + std::to_string(sequences));
  if (documentEntries > arrayBytes / 8)
    throw fail("document count", "at most " + std::to_string(arrayBytes / 8) + " for a file of " +
                                     std::to_string(indexSize) + " bytes, got " + std::to_string(documentEntries));
  const uint64_t plainSize = kIndexHeaderBytes + 12 * sequences + 8 * documentEntries;
  if (indexSize != plainSize && indexSize != plainSize + sequences)
    throw fail("file size", std::to_string(plainSize) + " bytes for " + std::to_string(sequences) + " sequences and " +
                                std::to_string(documentEntries) + " document indices (" +
                                std::to_string(plainSize + sequences) + " with sequence modes), got " +
                                std::to_string(indexSize));
  sequenceCount_ = static_cast<int64_t>(sequences);
  sequenceLengths_ = index + kIndexHeaderBytes;
  sequencePointers_ = sequenceLengths_ + 4 * sequences;
  const char* documentIndices = sequencePointers_ + 8 * sequences;
  if (indexSize != plainSize && sequences > 0) sequenceModes_ = documentIndices + 8 * documentEntries;

  if (documentEntries == 0) throw fail("document_indices", "at least the leading 0, got none");
  documentIndices_.resize(documentEntries);
  for (uint64_t i = 0; i < documentEntries; ++i) {
    const int64_t entry = load<int64_t>(documentIndices, static_cast<int64_t>(i));
    const int64_t previous = i == 0 ? 0 : documentIndices_[i - 1];
    const std::string field = "document_indices[" + std::to_string(i) + "]";
    if (i == 0 && entry != 0) throw fail(field, "0, got " + std::to_string(entry));
    if (entry < previous || entry > sequenceCount_)
      throw fail(field, "a sequence index in [" + std::to_string(previous) + ", " + std::to_string(sequenceCount_) +
                            "], got " + std::to_string(entry));
    documentIndices_[i] = entry;
  }
  if (documentIndices_.back() != sequenceCount_)
    throw fail("document_indices[" + std::to_string(documentEntries - 1) + "]",
               "the sequence count " + std::to_string(sequenceCount_) + " (the end of the last document), got " +
                   std::to_string(documentIndices_.back()));

  data_ = std::make_unique<Mapping>(dataFile);
  const auto dataSize = static_cast<int64_t>(std::min<uint64_t>(data_->size(), INT64_MAX));
  for (int64_t i = 0; i < sequenceCount_; ++i) {
    const int32_t length = load<int32_t>(sequenceLengths_, i);
    if (length < 0)
      throw fail("sequence_lengths[" + std::to_string(i) + "]", "a token count >= 0, got " + std::to_string(length));
    const int64_t pointer = load<int64_t>(sequencePointers_, i);
    if (pointer < 0 || pointer > dataSize || length * tokenBytes_ > dataSize - pointer)
      throw fail("sequence_pointers[" + std::to_string(i) + "]", "a byte offset whose " + std::to_string(length) + " " +
                                                                     tokenDTypeName(dtype_) + " tokens lie inside " +
                                                                     dataFile + " (" + std::to_string(dataSize) +
                                                                     " bytes), got " + std::to_string(pointer));
  }
}

IndexedDatasetReader::~IndexedDatasetReader() = default;
IndexedDatasetReader::IndexedDatasetReader(IndexedDatasetReader&&) noexcept = default;
IndexedDatasetReader& IndexedDatasetReader::operator=(IndexedDatasetReader&&) noexcept = default;

void IndexedDatasetReader::checkSequence(int64_t sequence) const {
  if (sequence < 0 || sequence >= sequenceCount_)
    throw InputError(prefix_ + ": sequence " + std::to_string(sequence) + ": expected an index in [0, " +
                     std::to_string(sequenceCount_) + ")");
}

int64_t IndexedDatasetReader::sequenceLength(int64_t sequence) const {
  checkSequence(sequence);
  return load<int32_t>(sequenceLengths_, sequence);
}

int64_t IndexedDatasetReader::sequencePointer(int64_t sequence) const {
  return load<int64_t>(sequencePointers_, sequence);
}

int8_t IndexedDatasetReader::sequenceMode(int64_t sequence) const {
  checkSequence(sequence);
  if (sequenceModes_ == nullptr)
    throw InputError(indexPath(prefix_) + ": expected sequence modes, got an index without them");
  return load<int8_t>(sequenceModes_, sequence);
}

void IndexedDatasetReader::readTokens(int64_t sequence, int64_t offset, int64_t length,
                                      std::vector<int64_t>& out) const {
  const int64_t sequenceTokens = sequenceLength(sequence);
  if (offset < 0 || length < 0 || offset > sequenceTokens || length > sequenceTokens - offset)
    throw InputError(prefix_ + ": sequence " + std::to_string(sequence) + ": expected a token range inside its " +
                     std::to_string(sequenceTokens) + " tokens, got [" + std::to_string(offset) + ", " +
                     std::to_string(offset) + " + " + std::to_string(length) + ")");
  const char* tokens =
      data_->bytes() == nullptr ? nullptr : data_->bytes() + sequencePointer(sequence) + offset * tokenBytes_;
  out.reserve(out.size() + static_cast<size_t>(length));
  for (int64_t i = 0; i < length; ++i) {
    switch (dtype_) {
      case TokenDType::UInt8: out.push_back(load<uint8_t>(tokens, i)); break;
      case TokenDType::Int8: out.push_back(load<int8_t>(tokens, i)); break;
      case TokenDType::Int16: out.push_back(load<int16_t>(tokens, i)); break;
      case TokenDType::UInt16: out.push_back(load<uint16_t>(tokens, i)); break;
      case TokenDType::Int32: out.push_back(load<int32_t>(tokens, i)); break;
      case TokenDType::Int64: out.push_back(load<int64_t>(tokens, i)); break;
      case TokenDType::Float32:
      case TokenDType::Float64: break;  // refused by the constructor
    }
  }
}

}  // namespace dgemma
