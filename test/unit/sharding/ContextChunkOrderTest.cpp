// The load-balanced chunk order of a dimension split over context ranks (Reshard.h;
// docs/parallelism.md, "Context parallelism"): rank c holds chunks c and 2N - 1 - c, and the inverse
// order puts gathered chunks back in sequence order.
#include <gtest/gtest.h>

#include "compiler/Transforms/Reshard.h"

namespace {

using mlir::SmallVector;

TEST(ContextChunkOrder, EachRankHoldsAChunkFromEitherEnd) {
  EXPECT_EQ(mlir::dg::balancedChunkOrder(1), (SmallVector<int64_t>{0, 1}));
  EXPECT_EQ(mlir::dg::balancedChunkOrder(2), (SmallVector<int64_t>{0, 3, 1, 2}));
  EXPECT_EQ(mlir::dg::balancedChunkOrder(4), (SmallVector<int64_t>{0, 7, 1, 6, 2, 5, 3, 4}));
}

TEST(ContextChunkOrder, TheSequenceOrderIsTheInverse) {
  for (int64_t ranks : {1, 2, 3, 4, 8}) {
    SmallVector<int64_t> balanced = mlir::dg::balancedChunkOrder(ranks);
    SmallVector<int64_t> sequence = mlir::dg::sequenceChunkOrder(ranks);
    ASSERT_EQ(sequence.size(), balanced.size());
    for (size_t position = 0; position < balanced.size(); ++position)
      EXPECT_EQ(sequence[balanced[position]], static_cast<int64_t>(position)) << ranks << " ranks";
  }
}

}  // namespace
