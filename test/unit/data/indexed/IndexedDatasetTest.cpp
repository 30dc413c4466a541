#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "runtime/data/indexed/IndexedDataset.h"
#include "runtime/data/indexed/IndexedDatasetWriter.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::fileBytes;
using test::mentions;
using test::TempDir;
using test::writeBytes;

using Document = std::vector<std::vector<int64_t>>;  // its sequences

void writeDataset(const std::string& prefix, TokenDType dtype, const std::vector<Document>& documents,
                  const std::vector<int8_t>& modes = {}) {
  IndexedDatasetWriter writer(prefix, dtype, !modes.empty());
  size_t sequence = 0;
  for (const Document& document : documents) {
    for (const std::vector<int64_t>& tokens : document)
      writer.addSequence(std::span<const int64_t>(tokens), modes.empty() ? 0 : modes[sequence++]);
    writer.endDocument();
  }
  writer.finish();
}

std::vector<Document> readDocuments(const IndexedDatasetReader& reader) {
  std::vector<Document> documents;
  const std::vector<int64_t>& boundaries = reader.documentIndices();
  for (size_t d = 0; d + 1 < boundaries.size(); ++d) {
    Document document;
    for (int64_t s = boundaries[d]; s < boundaries[d + 1]; ++s) {
      std::vector<int64_t> tokens;
      reader.readTokens(s, 0, reader.sequenceLength(s), tokens);
      document.push_back(tokens);
    }
    documents.push_back(document);
  }
  return documents;
}

template <typename Value>
void appendValue(std::string& bytes, Value value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof value);
}

TEST(IndexedFormat, DTypeForVocabularyFollowsMegatron) {
  EXPECT_EQ(tokenDTypeForVocabulary(256), TokenDType::UInt16);
  EXPECT_EQ(tokenDTypeForVocabulary(65499), TokenDType::UInt16);
  EXPECT_EQ(tokenDTypeForVocabulary(65500), TokenDType::Int32);
  EXPECT_EQ(tokenDTypeForVocabulary(262144), TokenDType::Int32);
  EXPECT_EQ(static_cast<int>(TokenDType::UInt16), 8);
  EXPECT_EQ(static_cast<int>(TokenDType::Int32), 4);
  EXPECT_FALSE(integerTokenDType(6));
  EXPECT_FALSE(integerTokenDType(7));
  EXPECT_FALSE(integerTokenDType(0));
  EXPECT_FALSE(integerTokenDType(9));
}

// The exact bytes of a small dataset, built field by field from the layout in IndexedFormat.h.
TEST(IndexedDatasetWriter, WritesTheMmidIdxLayout) {
  TempDir dir;
  const std::string prefix = dir / "corpus";
  writeDataset(prefix, TokenDType::UInt16, {{{5, 6, 7}, {8}}, {}, {{65535}}});

  std::string index(kIndexMagic);
  appendValue<uint64_t>(index, 1);
  appendValue<uint8_t>(index, 8);
  appendValue<uint64_t>(index, 3);  // sequences
  appendValue<uint64_t>(index, 4);  // document indices: 0, 2, 2, 3
  for (int32_t length : {3, 1, 1}) appendValue(index, length);
  for (int64_t pointer : {0, 6, 8}) appendValue(index, pointer);
  for (int64_t boundary : {0, 2, 2, 3}) appendValue(index, boundary);
  EXPECT_EQ(fileBytes(prefix + ".idx"), index);

  std::string data;
  for (uint16_t token : {5, 6, 7, 8, 65535}) appendValue(data, token);
  EXPECT_EQ(fileBytes(prefix + ".bin"), data);
}

TEST(IndexedDataset, RoundTripsEveryIntegerDType) {
  TempDir dir;
  const std::vector<std::pair<TokenDType, std::vector<int64_t>>> cases = {
      {TokenDType::UInt8, {0, 1, 255}},
      {TokenDType::Int8, {-128, 0, 127}},
      {TokenDType::Int16, {-32768, 7, 32767}},
      {TokenDType::UInt16, {0, 1, 65535}},
      {TokenDType::Int32, {std::numeric_limits<int32_t>::min(), 262143, std::numeric_limits<int32_t>::max()}},
      {TokenDType::Int64, {std::numeric_limits<int64_t>::min(), 3, std::numeric_limits<int64_t>::max()}},
  };
  for (const auto& [dtype, extremes] : cases) {
    SCOPED_TRACE(tokenDTypeName(dtype));
    const std::string prefix = dir / tokenDTypeName(dtype);
    const std::vector<Document> documents = {{extremes, {1, 2}}, {}, {{}, {3}}, {{4, 5, 6, 7}}};
    writeDataset(prefix, dtype, documents);
    const IndexedDatasetReader reader(prefix);
    EXPECT_EQ(reader.dtype(), dtype);
    EXPECT_EQ(reader.sequenceCount(), 5);
    EXPECT_EQ(reader.documentCount(), 4);
    EXPECT_EQ(reader.documentIndices(), (std::vector<int64_t>{0, 2, 2, 4, 5}));
    EXPECT_EQ(readDocuments(reader), documents);
    EXPECT_EQ(reader.vocabularyLimit(), tokenDTypeLimit(dtype));
    EXPECT_FALSE(reader.hasSequenceModes());
    std::vector<int64_t> middle = {99};
    reader.readTokens(4, 1, 2, middle);
    EXPECT_EQ(middle, (std::vector<int64_t>{99, 5, 6}));
  }
}

TEST(IndexedDataset, RoundTripsSequenceModes) {
  TempDir dir;
  const std::string prefix = dir / "modes";
  writeDataset(prefix, TokenDType::Int32, {{{1, 2}, {3}}, {{4}}}, {0, -1, 5});
  const IndexedDatasetReader reader(prefix);
  ASSERT_TRUE(reader.hasSequenceModes());
  EXPECT_EQ(reader.sequenceMode(0), 0);
  EXPECT_EQ(reader.sequenceMode(1), -1);
  EXPECT_EQ(reader.sequenceMode(2), 5);
  EXPECT_EQ(fileBytes(prefix + ".idx").size(), size_t(34 + 3 * 4 + 3 * 8 + 3 * 8 + 3));
}

TEST(IndexedDataset, EmptyDatasetRoundTrips) {
  TempDir dir;
  writeDataset(dir / "empty", TokenDType::UInt16, {});
  const IndexedDatasetReader reader(dir / "empty");
  EXPECT_EQ(reader.sequenceCount(), 0);
  EXPECT_EQ(reader.documentIndices(), std::vector<int64_t>{0});
}

TEST(IndexedDatasetWriter, FinishClosesAnOpenDocument) {
  TempDir dir;
  IndexedDatasetWriter writer(dir / "open", TokenDType::UInt16);
  writer.addSequence(std::vector<int32_t>{1, 2});
  writer.finish();
  EXPECT_EQ(IndexedDatasetReader(dir / "open").documentIndices(), (std::vector<int64_t>{0, 1}));
}

TEST(IndexedDatasetWriter, RefusesTokensTheDTypeCannotHoldAndLeavesNothing) {
  TempDir dir;
  const std::string prefix = dir / "bad";
  {
    IndexedDatasetWriter writer(prefix, TokenDType::UInt16);
    writer.addSequence(std::vector<int32_t>{1, 2});
    const std::string message = expectInputError([&] { writer.addSequence(std::vector<int32_t>{3, 65536}); });
    EXPECT_TRUE(
        mentions(message, "bad.bin: sequence 1: token id 65536 at position 1 does not fit uint16 ([0, 65536))"));
    EXPECT_TRUE(mentions(expectInputError([&] { writer.addSequence(std::vector<int32_t>{-1}); }), "token id -1"));
  }
  // Destroyed without finish(): no output, no temporary file.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path));
}

TEST(IndexedDatasetWriter, KeepsAnExistingDatasetUntilFinish) {
  TempDir dir;
  const std::string prefix = dir / "kept";
  writeDataset(prefix, TokenDType::UInt16, {{{1, 2, 3}}});
  const std::string index = fileBytes(prefix + ".idx"), data = fileBytes(prefix + ".bin");
  {
    IndexedDatasetWriter writer(prefix, TokenDType::UInt16);
    writer.addSequence(std::vector<int32_t>{9});
  }
  EXPECT_EQ(fileBytes(prefix + ".idx"), index);
  EXPECT_EQ(fileBytes(prefix + ".bin"), data);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path), {}), 2);
}

TEST(IndexedDatasetWriter, RefusesFloatDTypes) {
  TempDir dir;
  EXPECT_TRUE(mentions(expectInputError([&] { IndexedDatasetWriter(dir / "f", TokenDType::Float32); }),
                       "expected an integer token dtype, got float32"));
}

// A valid two-document dataset whose index the corruption tests change.
class CorruptIndex : public ::testing::Test {
 protected:
  void SetUp() override {
    prefix_ = dir_ / "corpus";
    writeDataset(prefix_, TokenDType::UInt16, {{{1, 2, 3}, {4}}, {{5, 6}}});
    index_ = fileBytes(prefix_ + ".idx");
  }
  // The reader's message for the index with `bytes` at `offset` (and cut to `size` if given).
  std::string openWith(size_t offset, const std::string& bytes, size_t size = std::string::npos) {
    std::string changed = index_;
    changed.replace(offset, bytes.size(), bytes);
    writeBytes(prefix_ + ".idx", changed.substr(0, size));
    return expectInputError([&] { IndexedDatasetReader reader(prefix_); });
  }
  template <typename Value>
  static std::string encoded(Value value) {
    std::string bytes;
    appendValue(bytes, value);
    return bytes;
  }
  // Offsets of the arrays: 3 sequences, 3 document indices.
  static constexpr size_t kLengths = 34, kPointers = 34 + 12, kDocuments = 34 + 36;

  TempDir dir_;
  std::string prefix_, index_;
};

TEST_F(CorruptIndex, MagicVersionAndDType) {
  EXPECT_TRUE(mentions(openWith(0, "NOTANIDX"), "corpus.idx: magic: expected \"MMIDIDX\\x00\\x00\""));
  EXPECT_TRUE(mentions(openWith(9, encoded<uint64_t>(2)), "corpus.idx: version: expected 1, got 2"));
  EXPECT_TRUE(mentions(openWith(17, encoded<uint8_t>(7)), "corpus.idx: dtype code: expected an integer token dtype"));
  EXPECT_TRUE(mentions(openWith(17, encoded<uint8_t>(7)), "got 7 (float32)"));
  EXPECT_TRUE(mentions(openWith(17, encoded<uint8_t>(42)), "got 42"));
}

TEST_F(CorruptIndex, SizesThatDoNotAddUp) {
  EXPECT_TRUE(mentions(openWith(0, "", 20), "corpus.idx: header: expected 34 bytes"));
  EXPECT_TRUE(mentions(openWith(0, "", index_.size() - 1), "corpus.idx: file size: expected 94 bytes for 3 sequences"));
  EXPECT_TRUE(
      mentions(openWith(18, encoded<uint64_t>(uint64_t{1} << 62)), "corpus.idx: sequence count: expected at most"));
  EXPECT_TRUE(mentions(openWith(26, encoded<uint64_t>(~uint64_t{0})), "corpus.idx: document count: expected at most"));
  EXPECT_TRUE(mentions(openWith(18, encoded<uint64_t>(2)), "corpus.idx: file size: expected"));
}

TEST_F(CorruptIndex, DocumentIndices) {
  EXPECT_TRUE(
      mentions(openWith(kDocuments, encoded<int64_t>(1)), "corpus.idx: document_indices[0]: expected 0, got 1"));
  EXPECT_TRUE(mentions(openWith(kDocuments + 8, encoded<int64_t>(4)),
                       "corpus.idx: document_indices[1]: expected a sequence index in [0, 3], got 4"));
  EXPECT_TRUE(mentions(openWith(kDocuments + 16, encoded<int64_t>(1)),
                       "corpus.idx: document_indices[2]: expected a sequence index in [2, 3], got 1"));
  EXPECT_TRUE(mentions(openWith(kDocuments + 16, encoded<int64_t>(2)),
                       "corpus.idx: document_indices[2]: expected the sequence count 3"));
}

TEST_F(CorruptIndex, LengthsAndPointersOutsideTheData) {
  EXPECT_TRUE(mentions(openWith(kLengths, encoded<int32_t>(-1)),
                       "corpus.idx: sequence_lengths[0]: expected a token count >= 0, got -1"));
  EXPECT_TRUE(mentions(openWith(kLengths + 8, encoded<int32_t>(3)),
                       "corpus.idx: sequence_pointers[2]: expected a byte offset whose 3 uint16 tokens lie inside"));
  EXPECT_TRUE(mentions(openWith(kPointers + 8, encoded<int64_t>(-2)), "sequence_pointers[1]"));
  EXPECT_TRUE(
      mentions(openWith(kPointers + 8, encoded<int64_t>(std::numeric_limits<int64_t>::max())), "sequence_pointers[1]"));
}

TEST_F(CorruptIndex, TruncatedDataFile) {
  const std::string data = fileBytes(prefix_ + ".bin");
  writeBytes(prefix_ + ".bin", data.substr(0, data.size() - 1));
  const std::string message = expectInputError([&] { IndexedDatasetReader reader(prefix_); });
  EXPECT_TRUE(
      mentions(message, "corpus.idx: sequence_pointers[2]: expected a byte offset whose 2 uint16 tokens lie inside"));
  EXPECT_TRUE(mentions(message, "corpus.bin (11 bytes), got 8"));
}

TEST_F(CorruptIndex, MissingFiles) {
  std::filesystem::remove(prefix_ + ".bin");
  EXPECT_TRUE(mentions(expectInputError([&] { IndexedDatasetReader reader(prefix_); }), "corpus.bin: cannot read"));
  EXPECT_TRUE(mentions(expectInputError([&] { IndexedDatasetReader reader(dir_ / "none"); }), "none.idx: cannot read"));
}

TEST_F(CorruptIndex, ReadsOutsideASequenceAreRefused) {
  const IndexedDatasetReader reader(prefix_);
  std::vector<int64_t> out;
  EXPECT_TRUE(
      mentions(expectInputError([&] { reader.readTokens(3, 0, 1, out); }), "sequence 3: expected an index in [0, 3)"));
  EXPECT_TRUE(mentions(expectInputError([&] { reader.readTokens(0, 2, 2, out); }),
                       "sequence 0: expected a token range inside its 3 tokens, got [2, 2 + 2)"));
  EXPECT_TRUE(mentions(expectInputError([&] { reader.readTokens(0, -1, 1, out); }), "sequence 0"));
  EXPECT_TRUE(out.empty());
}

}  // namespace
}  // namespace dgemma
