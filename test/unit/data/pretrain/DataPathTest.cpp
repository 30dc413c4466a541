#include <gtest/gtest.h>

#include "runtime/data/pretrain/DataPath.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::mentions;

TEST(DataPath, OnePrefixOrWeightedPairs) {
  const std::vector<DataPathEntry> one = parseDataPath("data/corpus_text_document");
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].prefix, "data/corpus_text_document");
  EXPECT_EQ(one[0].weight, 1.0);

  const std::vector<DataPathEntry> two = parseDataPath("  0.7 A\t0.3   B \n");
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0].weight, 0.7);
  EXPECT_EQ(two[0].prefix, "A");
  EXPECT_EQ(two[1].weight, 0.3);
  EXPECT_EQ(two[1].prefix, "B");

  const std::vector<DataPathEntry> words = parseDataPath(std::vector<std::string>{"2", "x/a", "1e0", "x/b"});
  ASSERT_EQ(words.size(), 2u);
  EXPECT_EQ(words[0].weight, 2.0);
  EXPECT_EQ(words[1].prefix, "x/b");
}

TEST(DataPath, BadStringsNameTheWordAndColumn) {
  auto error = [](const std::string& text) { return expectInputError([&] { parseDataPath(text); }); };
  EXPECT_TRUE(mentions(error("   "), "--data-path: expected a dataset prefix or weight-prefix pairs, got nothing"));
  EXPECT_TRUE(mentions(error("0.7 A 0.3"), "word 3 at column 7 ('0.3'): expected a dataset prefix after this weight"));
  EXPECT_TRUE(mentions(error("A B"), "word 1 at column 1 ('A'): expected a weight (a number > 0) before each prefix"));
  EXPECT_TRUE(mentions(error("0.7 A x B"), "word 3 at column 7 ('x'): expected a weight"));
  EXPECT_TRUE(mentions(error("-1 A"), "word 1 at column 1 ('-1'): expected a weight > 0"));
  EXPECT_TRUE(mentions(error("0 A"), "word 1 at column 1 ('0'): expected a weight > 0"));
  EXPECT_TRUE(mentions(error("nan A"), "('nan'): expected a weight > 0"));
  EXPECT_TRUE(mentions(error("0.7 0.3 A B"), "word 2 at column 5 ('0.3'): expected a dataset prefix, got a number"));
  EXPECT_TRUE(
      mentions(error("1 data/a.bin"),
               "word 2 at column 3 ('data/a.bin'): expected the prefix of PREFIX.bin and PREFIX.idx, without '.bin'"));
  EXPECT_TRUE(mentions(error("corpus.idx"), "word 1 at column 1 ('corpus.idx')"));
  EXPECT_TRUE(mentions(error("0.5"), "word 1 at column 1 ('0.5'): expected a dataset prefix, got a number"));
  // Words from the command line have no column.
  EXPECT_TRUE(mentions(expectInputError([] { parseDataPath(std::vector<std::string>{"0.7", "A", "B"}); }),
                       "--data-path: word 3 ('B'): expected a weight"));
}

}  // namespace
}  // namespace dgemma
