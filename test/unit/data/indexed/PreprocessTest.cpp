#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <sstream>
#include <vector>

#include "runtime/data/indexed/CorpusLines.h"
#include "runtime/data/indexed/IndexedDataset.h"
#include "runtime/data/indexed/Preprocess.h"
#include "runtime/data/text/Tokenizer.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::fileBytes;
using test::mentions;
using test::TempDir;
using test::writeBytes;

std::string gzipped(const std::string& text) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);  // 16: gzip framing
  std::string out(deflateBound(&stream, text.size()) + 32, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  stream.avail_in = static_cast<uInt>(text.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::vector<std::string> allLines(const std::string& path) {
  CorpusLines lines(path);
  std::vector<std::string> out;
  std::string line;
  while (lines.next(line)) out.push_back(line);
  return out;
}

TEST(CorpusLines, PlainTextWithCrLfAndNoFinalNewline) {
  TempDir dir;
  writeBytes(dir / "a.jsonl", "one\r\ntwo\n\nthree");
  EXPECT_EQ(allLines(dir / "a.jsonl"), (std::vector<std::string>{"one", "two", "", "three"}));
  writeBytes(dir / "empty.jsonl", "");
  EXPECT_TRUE(allLines(dir / "empty.jsonl").empty());
}

TEST(CorpusLines, RefusesALineLongerThanTheLimit) {
  TempDir dir;
  writeBytes(dir / "long.jsonl", "short\n" + std::string(3 << 20, 'x') + "\n");  // across read buffers
  CorpusLines lines(dir / "long.jsonl", 2 << 20);
  std::string line;
  ASSERT_TRUE(lines.next(line));
  EXPECT_TRUE(mentions(expectInputError([&] { lines.next(line); }),
                       "long.jsonl:2: row: expected a line of at most 2097152 bytes, got more"));
}

TEST(CorpusLines, GzipByMagicBytesWhateverTheName) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "line " + std::to_string(i) + "\n";  // several read buffers
  // Two gzip members back to back, as `cat a.gz b.gz` makes them.
  writeBytes(dir / "corpus.jsonl", gzipped(text.substr(0, 1000)) + gzipped(text.substr(1000)));
  CorpusLines lines(dir / "corpus.jsonl");
  EXPECT_TRUE(lines.compressed());
  std::string line;
  int64_t count = 0;
  while (lines.next(line)) ASSERT_EQ(line, "line " + std::to_string(count++));
  EXPECT_EQ(count, 100000);
  EXPECT_EQ(lines.bytesRead(), static_cast<int64_t>(text.size()));
}

TEST(CorpusLines, TruncatedGzipIsAnError) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "{\"text\": \"" + std::to_string(i) + "\"}\n";
  const std::string compressed = gzipped(text);
  writeBytes(dir / "cut.gz", compressed.substr(0, compressed.size() / 2));
  const std::string message = expectInputError([&] { allLines(dir / "cut.gz"); });
  EXPECT_TRUE(mentions(message, "cut.gz: gzip: expected a complete gzip stream"));
}

class Preprocess : public ::testing::Test {
 protected:
  Preprocess() : tokenizer_(DGEMMA_TOKENIZER_DIR) {}

  PreprocessSummary run(const std::string& corpus, int64_t workers = 1, bool skipBadLines = false,
                        std::vector<std::string> keys = {"text"}) {
    writeBytes(dir_ / "corpus.jsonl", corpus);
    PreprocessOptions options;
    options.input = dir_ / "corpus.jsonl";
    options.jsonKeys = std::move(keys);
    options.outputPrefix = dir_ / ("out" + std::to_string(workers));
    options.workers = workers;
    options.skipBadLines = skipBadLines;
    std::ostringstream progress;
    return preprocessCorpus(options, tokenizer_, progress, false);
  }
  std::vector<int64_t> sequence(const IndexedDatasetReader& reader, int64_t s) {
    std::vector<int64_t> tokens;
    reader.readTokens(s, 0, reader.sequenceLength(s), tokens);
    return tokens;
  }
  std::vector<int64_t> encodeWithEod(const std::string& text) {
    std::vector<int32_t> ids = tokenizer_.encode(text);
    ids.push_back(tokenizer_.eosId());
    return {ids.begin(), ids.end()};
  }

  TempDir dir_;
  Tokenizer tokenizer_;
};

TEST_F(Preprocess, DocumentsAreTheTokenizersIdsWithEod) {
  const PreprocessSummary summary =
      run("{\"text\": \"Hello world\"}\n\n  \n{\"text\": \"\", \"id\": 3}\n{\"text\": [\"One.\", \"\", \"Two <eos> "
          "three\"]}\n");
  EXPECT_EQ(summary.lines, 5);
  EXPECT_EQ(summary.blankLines, 2);
  EXPECT_EQ(summary.documents, 3);
  EXPECT_EQ(summary.dtype, "uint16");  // 256 pieces
  const IndexedDatasetReader reader(dir_ / "out1");
  EXPECT_EQ(reader.dtype(), TokenDType::UInt16);
  // The empty text is a document without sequences (and without EOD), as in preprocess_data.py; an
  // array's strings are one sequence each, the empty one dropped, EOD at the end of the last.
  EXPECT_EQ(reader.documentIndices(), (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(sequence(reader, 0), encodeWithEod("Hello world"));
  const std::vector<int32_t> one = tokenizer_.encode("One.");
  EXPECT_EQ(sequence(reader, 1), std::vector<int64_t>(one.begin(), one.end()));
  EXPECT_EQ(sequence(reader, 2), encodeWithEod("Two <eos> three"));
  EXPECT_EQ(summary.tokens[0], reader.sequenceLength(0) + reader.sequenceLength(1) + reader.sequenceLength(2));
}

TEST_F(Preprocess, OutputIsTheSameBytesForEveryWorkerCount) {
  std::string corpus;
  for (int i = 0; i < 20000; ++i)
    corpus += "{\"text\": \"Document " + std::to_string(i) + std::string(i % 37, 'x') + " ends here.\"}\n";
  run(corpus, 1);
  run(corpus, 2);
  run(corpus, 3);
  EXPECT_EQ(IndexedDatasetReader(dir_ / "out1").documentCount(), 20000);
  for (const std::string prefix : {"out2", "out3"}) {
    EXPECT_EQ(fileBytes(dir_ / (prefix + ".bin")), fileBytes(dir_ / "out1.bin"));
    EXPECT_EQ(fileBytes(dir_ / (prefix + ".idx")), fileBytes(dir_ / "out1.idx"));
  }
}

TEST_F(Preprocess, SeveralKeysGoToMegatronsPrefixes) {
  run("{\"title\": \"A\", \"text\": \"B c\"}\n", 1, false, {"text", "title"});
  EXPECT_EQ(sequence(IndexedDatasetReader(dir_ / "out1_text_document"), 0), encodeWithEod("B c"));
  EXPECT_EQ(sequence(IndexedDatasetReader(dir_ / "out1_title_document"), 0), encodeWithEod("A"));
  EXPECT_FALSE(std::filesystem::exists(dir_ / "out1.idx"));
}

TEST_F(Preprocess, ABadLineNamesFileLineAndFieldAndLeavesNoOutput) {
  std::string good;
  for (int i = 0; i < 5000; ++i) good += "{\"text\": \"fine\"}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"text\": 5}", ":5001: text: expected a string or an array of strings, got number"},
      {"{\"body\": \"x\"}", ":5001: text: expected a string or an array of strings, got nothing (the key is missing)"},
      {"{\"text\": [\"a\", null]}", ":5001: text[1]: expected a string, got null"},
      {"[\"text\"]", ":5001: row: expected a JSON object, got array"},
      {"{\"text\": \"unterminated", ":5001: "},
      {"{\"text\": \"\xff\"}", ":5001: row: expected UTF-8 text"},
  };
  for (const auto& [line, expected] : cases) {
    SCOPED_TRACE(line);
    for (const int64_t workers : {1, 2}) {
      const std::string message =
          expectInputError([&] { run(good + line + "\n" + good + "{\"text\": 1}\n", workers); });
      EXPECT_TRUE(mentions(message, "corpus.jsonl" + expected));
      std::vector<std::string> left;
      for (const auto& entry : std::filesystem::directory_iterator(dir_.path)) left.push_back(entry.path().filename());
      EXPECT_EQ(left, std::vector<std::string>{"corpus.jsonl"});
    }
  }
}

TEST_F(Preprocess, SkipBadLinesCountsAndListsThem) {
  const PreprocessSummary summary = run("{\"text\": \"a\"}\n{\"text\": 1}\n{\"text\": \"b\"}\nnot json\n", 2, true);
  ASSERT_EQ(summary.skipped.size(), 2u);
  EXPECT_EQ(summary.skipped[0].line, 2);
  EXPECT_EQ(summary.skipped[1].line, 4);
  EXPECT_EQ(summary.documents, 2);
  const IndexedDatasetReader reader(dir_ / "out2");
  EXPECT_EQ(sequence(reader, 1), encodeWithEod("b"));
}

}  // namespace
}  // namespace dgemma
