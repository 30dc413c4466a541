#include <gtest/gtest.h>

#include <vector>

#include "runtime/generate/CanvasFinalization.h"

namespace dgemma {
namespace {

using Ids = std::vector<int64_t>;
const Ids kEos = {1, 106, 50};

TEST(CanvasFinalization, TokensAfterTheFirstEosBecomePad) {
  Ids canvas = {5, 106, 7, 1, 9};
  EXPECT_TRUE(finalizeCanvas(canvas, false, kEos, 0));
  EXPECT_EQ(canvas, (Ids{5, 106, 0, 0, 0}));
}

TEST(CanvasFinalization, AnyEosIdFinishesTheRowAnywhereInTheCanvas) {
  Ids last = {3, 4, 50};
  EXPECT_TRUE(finalizeCanvas(last, false, kEos, 0));
  EXPECT_EQ(last, (Ids{3, 4, 50}));
  Ids first = {1, 4, 5};
  EXPECT_TRUE(finalizeCanvas(first, false, kEos, 9));
  EXPECT_EQ(first, (Ids{1, 9, 9}));
}

TEST(CanvasFinalization, ACanvasWithoutEosStaysAndTheRowGoesOn) {
  Ids canvas = {3, 0, 4};
  EXPECT_FALSE(finalizeCanvas(canvas, false, kEos, 0));
  EXPECT_EQ(canvas, (Ids{3, 0, 4}));
}

TEST(CanvasFinalization, ARowFinishedEarlierGetsAnAllPadCanvas) {
  Ids canvas = {3, 1, 4};
  EXPECT_TRUE(finalizeCanvas(canvas, true, kEos, 0));
  EXPECT_EQ(canvas, (Ids{0, 0, 0}));
}

TEST(CanvasFinalization, TokensPerForwardCountsEveryNonPadToken) {
  EXPECT_DOUBLE_EQ(tokensPerForward(Ids{5, 1, 0, 0}, 4, 0), 0.5);
  EXPECT_DOUBLE_EQ(tokensPerForward(Ids{5, 0, 6, 1}, 2, 0), 1.5);  // a generated pad id is not counted either
  EXPECT_DOUBLE_EQ(tokensPerForward(Ids{5, 6}, 0, 0), 0.0);
}

}  // namespace
}  // namespace dgemma
