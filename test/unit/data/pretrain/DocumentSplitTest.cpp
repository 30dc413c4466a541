#include <gtest/gtest.h>

#include "runtime/data/pretrain/DocumentSplit.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::mentions;

using Ranges = std::vector<std::pair<int64_t, int64_t>>;

Ranges ranges(const std::string& split, int64_t documents) {
  Ranges result;
  for (const DocumentRange& range : splitDocumentRanges(parseSplit(split), documents))
    result.push_back({range.begin, range.end});
  return result;
}

// The expected ranges are megatron-core 0.16.1's (parse_and_normalize_split,
// convert_split_vector_to_split_matrix and the builder's int(round(bookend · D))) evaluated in
// Python; a part it builds no dataset for (None) is an empty range here. Python's round() rounds
// half to even: "1,1" over 5 documents ends the train part at round(2.5) = 2, over 7 at round(3.5) = 4.
// test/unit/data/pretrain/megatron_interop.py checks more cases against megatron-core itself.
TEST(DocumentSplit, RangesFollowMegatronCore) {
  EXPECT_EQ(ranges("969,30,1", 1000), (Ranges{{0, 969}, {969, 999}, {999, 1000}}));
  EXPECT_EQ(ranges("969,30,1", 12345), (Ranges{{0, 11962}, {11962, 12333}, {12333, 12345}}));
  EXPECT_EQ(ranges("8,1,1", 10), (Ranges{{0, 8}, {8, 9}, {9, 10}}));
  EXPECT_EQ(ranges("1,1", 5), (Ranges{{0, 2}, {2, 5}, {5, 5}}));
  EXPECT_EQ(ranges("1,1", 7), (Ranges{{0, 4}, {4, 7}, {7, 7}}));
  EXPECT_EQ(ranges("1,1,1", 2), (Ranges{{0, 1}, {1, 1}, {1, 2}}));
  EXPECT_EQ(ranges("1,1,1", 10), (Ranges{{0, 3}, {3, 7}, {7, 10}}));
  EXPECT_EQ(ranges("0,1,1", 3), (Ranges{{0, 0}, {0, 2}, {2, 3}}));
  EXPECT_EQ(ranges("98/2", 17), (Ranges{{0, 17}, {17, 17}, {17, 17}}));
  EXPECT_EQ(ranges("1", 4), (Ranges{{0, 4}, {4, 4}, {4, 4}}));
  EXPECT_EQ(ranges("2,1,1", 101), (Ranges{{0, 50}, {50, 76}, {76, 101}}));
}

TEST(DocumentSplit, FormatsBackTheWeights) {
  EXPECT_EQ(formatSplit(parseSplit("969,30,1")), "969,30,1");
  EXPECT_EQ(formatSplit(parseSplit("0.5/0.25")), "0.5,0.25,0");
}

TEST(DocumentSplit, BadSplitsAreLocated) {
  EXPECT_TRUE(
      mentions(expectInputError([] { parseSplit("969,x,1"); }), "--split: item 2 ('x'): expected a number >= 0"));
  EXPECT_TRUE(mentions(expectInputError([] { parseSplit("-1,2"); }), "item 1 ('-1')"));
  EXPECT_TRUE(mentions(expectInputError([] { parseSplit("1,,1"); }), "item 2 ('')"));
  EXPECT_TRUE(mentions(expectInputError([] { parseSplit("inf,1"); }), "item 1 ('inf')"));
  EXPECT_TRUE(mentions(expectInputError([] { parseSplit("1,2,3,4"); }), "at most 3 weights"));
  EXPECT_TRUE(mentions(expectInputError([] { parseSplit("0,0,0"); }), "at least one weight above 0"));
}

}  // namespace
}  // namespace dgemma
