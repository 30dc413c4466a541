// dgemma-run preprocess and inspect-data as a user runs them (docs/pretraining.md, "Preprocessing",
// "Indexed datasets"; docs/cli.md): exit codes, located messages, nothing written on failure, gzip
// input and worker counts that give the same bytes. megatron-core's side is
// test/interop/indexed_dataset_interop.py.
#include <gtest/gtest.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "test/integration/ToolRunner.h"

namespace dgemma::testing {
namespace {

const std::string kRun = DGEMMA_RUN;
const std::string kTokenizer = std::string(DGEMMA_SOURCE_DIR) + "/data/tokenizer";

std::string readFile(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(stream), {});
}

void writeFile(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

void writeGzip(const std::string& path, const std::string& text) {
  gzFile file = gzopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(gzwrite(file, text.data(), static_cast<unsigned>(text.size())), static_cast<int>(text.size()));
  gzclose(file);
}

std::string corpus() {
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += "{\"text\": \"Row " + std::to_string(i) + ": the quick brown fox " + std::string(i % 13, '!') + "\"}\n";
  return text;
}

ToolResult preprocess(const std::string& input, const std::string& prefix, const std::string& extra = "") {
  return runTool(kRun + " preprocess --input " + input + " --json-keys text --tokenizer " + kTokenizer +
                 " --output-prefix " + prefix + " " + extra);
}

TEST(PreprocessCli, GzipAndWorkerCountsGiveTheSameBytes) {
  ScratchDirectory dir;
  writeFile(dir / "corpus.jsonl", corpus());
  writeGzip(dir / "corpus.data", corpus());  // gzip whatever the name
  const ToolResult plain = preprocess(dir / "corpus.jsonl", dir / "plain", "--workers 1");
  ASSERT_EQ(plain.exitCode, 0) << plain.output;
  EXPECT_TRUE(contains(plain, "plain.bin, " + (dir / "plain.idx") + ": 3000 documents of \"text\""));
  EXPECT_TRUE(contains(plain, "(uint16)"));
  EXPECT_TRUE(contains(plain, "preprocessed 3000 lines"));
  const ToolResult compressed = preprocess(dir / "corpus.data", dir / "gzip", "--workers 2");
  ASSERT_EQ(compressed.exitCode, 0) << compressed.output;
  EXPECT_TRUE(contains(compressed, "MB of JSONL, gzip"));
  EXPECT_EQ(readFile(dir / "gzip.bin"), readFile(dir / "plain.bin"));
  EXPECT_EQ(readFile(dir / "gzip.idx"), readFile(dir / "plain.idx"));

  const ToolResult summary = runTool(kRun + " inspect-data --prefix " + (dir / "plain"));
  ASSERT_EQ(summary.exitCode, 0) << summary.output;
  EXPECT_TRUE(contains(summary, "uint16, 3000 documents, 3000 sequences"));
}

TEST(PreprocessCli, AppendEodIsTheDefaultAndCanBeTurnedOff) {
  ScratchDirectory dir;
  writeFile(dir / "corpus.jsonl", "{\"text\": \"Hello\"}\n");
  ASSERT_EQ(preprocess(dir / "corpus.jsonl", dir / "default").exitCode, 0);
  ASSERT_EQ(preprocess(dir / "corpus.jsonl", dir / "megatron", "--append-eod").exitCode, 0);
  ASSERT_EQ(preprocess(dir / "corpus.jsonl", dir / "none", "--no-append-eod").exitCode, 0);
  EXPECT_EQ(readFile(dir / "megatron.bin"), readFile(dir / "default.bin"));
  const std::string with = readFile(dir / "default.bin"), without = readFile(dir / "none.bin");
  ASSERT_EQ(with.size(), without.size() + 2);
  EXPECT_EQ(with.substr(0, without.size()), without);
  EXPECT_EQ(with.substr(without.size()), std::string("\x01\x00", 2));  // the bundled tokenizer's EOS, 1
}

TEST(PreprocessCli, ABadLineIsExit2WithItsLocationAndNoOutput) {
  ScratchDirectory dir;
  writeFile(dir / "corpus.jsonl", corpus() + "{\"text\": null}\n" + corpus());
  std::filesystem::create_directory(dir / "out");
  const ToolResult result = preprocess(dir / "corpus.jsonl", dir / "out/data", "--workers 2");
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, "dgemma-run: error: " + (dir / "corpus.jsonl") +
                                   ":3001: text: expected a string or an array of strings, got null"))
      << result.output;
  EXPECT_TRUE(std::filesystem::is_empty(dir / "out"));

  const ToolResult skipped = preprocess(dir / "corpus.jsonl", dir / "out/data", "--skip-bad-lines");
  EXPECT_EQ(skipped.exitCode, 0) << skipped.output;
  EXPECT_TRUE(contains(skipped, "skipped: " + (dir / "corpus.jsonl") + ":3001: text:"));
  EXPECT_TRUE(contains(skipped, "6000 documents"));
  EXPECT_TRUE(contains(skipped, "1 skipped"));
}

TEST(PreprocessCli, FlagsAndPathsAreChecked) {
  ScratchDirectory dir;
  writeFile(dir / "corpus.jsonl", corpus());
  EXPECT_EQ(preprocess(dir / "corpus.jsonl", dir / "x", "--workers 0").exitCode, 2);
  const ToolResult twice =
      runTool(kRun + " preprocess --input " + (dir / "corpus.jsonl") + " --json-keys text text --tokenizer " +
              kTokenizer + " --output-prefix " + (dir / "x"));
  EXPECT_EQ(twice.exitCode, 2);
  EXPECT_TRUE(contains(twice, "--json-keys: expected distinct keys, got \"text\" twice")) << twice.output;
  // The output would overwrite the input.
  writeFile(dir / "clash.bin", corpus());
  const ToolResult clash = preprocess(dir / "clash.bin", dir / "clash");
  EXPECT_EQ(clash.exitCode, 2);
  EXPECT_TRUE(contains(clash, "--output-prefix")) << clash.output;
  EXPECT_EQ(readFile(dir / "clash.bin"), corpus());
  const ToolResult missing = preprocess(dir / "none.jsonl", dir / "x");
  EXPECT_EQ(missing.exitCode, 2);
  EXPECT_TRUE(contains(missing, "none.jsonl: cannot read")) << missing.output;
}

TEST(PreprocessCli, InspectDataRefusesACorruptIndex) {
  ScratchDirectory dir;
  writeFile(dir / "corpus.jsonl", corpus());
  ASSERT_EQ(preprocess(dir / "corpus.jsonl", dir / "data").exitCode, 0);
  const std::string index = readFile(dir / "data.idx");
  writeFile(dir / "data.idx", index.substr(0, index.size() - 8));
  const ToolResult result = runTool(kRun + " inspect-data --prefix " + (dir / "data") + " --json");
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(
      contains(result, "data.idx: file size: expected " + std::to_string(index.size()) + " bytes for 3000 sequences"))
      << result.output;
}

}  // namespace
}  // namespace dgemma::testing
