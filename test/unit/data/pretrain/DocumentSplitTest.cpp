#include <gtest/gtest.h>

#include "runtime/data/pretrain/DocumentSplit.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::mentions;

std::array<int64_t, 4> boundaries(const std::string& split, int64_t documents) {
  const std::array<DocumentRange, 3> ranges = splitDocumentRanges(parseSplit(split), documents);
  for (int part = 0; part < 3; ++part) EXPECT_EQ(ranges[part].size() >= 0, true);
  EXPECT_EQ(ranges[0].end, ranges[1].begin);
  EXPECT_EQ(ranges[1].end, ranges[2].begin);
  return {ranges[0].begin, ranges[1].begin, ranges[2].begin, ranges[2].end};
}

// The expected boundaries are Megatron's get_train_valid_test_split_ evaluated in Python 3 (its
// round() rounds half to even: "1,1" over 5 documents is round(2.5) = 2 twice, then shifted by 1).
TEST(DocumentSplit, RangesFollowMegatronsRule) {
  EXPECT_EQ(boundaries("969,30,1", 1000), (std::array<int64_t, 4>{0, 969, 999, 1000}));
  EXPECT_EQ(boundaries("969,30,1", 12345), (std::array<int64_t, 4>{0, 11963, 12333, 12345}));
  EXPECT_EQ(boundaries("8,1,1", 10), (std::array<int64_t, 4>{0, 8, 9, 10}));
  EXPECT_EQ(boundaries("1,1", 5), (std::array<int64_t, 4>{0, 3, 5, 5}));
  EXPECT_EQ(boundaries("1,1", 7), (std::array<int64_t, 4>{0, 3, 7, 7}));
  EXPECT_EQ(boundaries("1,1,1", 3), (std::array<int64_t, 4>{0, 1, 2, 3}));
  EXPECT_EQ(boundaries("1,1,1", 2), (std::array<int64_t, 4>{0, 0, 1, 2}));
  EXPECT_EQ(boundaries("98/2", 17), (std::array<int64_t, 4>{0, 17, 17, 17}));
  EXPECT_EQ(boundaries("1", 4), (std::array<int64_t, 4>{0, 4, 4, 4}));
  EXPECT_EQ(boundaries("2,1,1", 101), (std::array<int64_t, 4>{0, 51, 76, 101}));
}

// Megatron gives [0, -1, 1, 3] here (and its validation part would index document -1); dgemma stops
// the boundary at 0.
TEST(DocumentSplit, AShiftBelowZeroStopsAtZero) {
  EXPECT_EQ(boundaries("0,1,1", 3), (std::array<int64_t, 4>{0, 0, 1, 3}));
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
