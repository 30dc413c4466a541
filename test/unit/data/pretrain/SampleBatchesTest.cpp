#include <gtest/gtest.h>

#include "runtime/data/pretrain/SampleBatches.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::mentions;

TEST(SampleBatches, MicroBatchesFollowTheConsumedCount) {
  const SampleBatchLayout layout{.microBatch = 6, .accumulation = 2, .dataParallel = 3};
  EXPECT_EQ(layout.globalBatch(), 12);
  EXPECT_EQ(rankMicroBatchSamples(layout, 0, 0, 0), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(rankMicroBatchSamples(layout, 0, 0, 2), (std::vector<int64_t>{4, 5}));
  EXPECT_EQ(rankMicroBatchSamples(layout, 0, 1, 0), (std::vector<int64_t>{6, 7}));
  EXPECT_EQ(rankMicroBatchSamples(layout, 36, 1, 1), (std::vector<int64_t>{44, 45}));
}

TEST(SampleBatches, BadLayoutsAreInputErrors) {
  const SampleBatchLayout layout{.microBatch = 4, .accumulation = 2, .dataParallel = 2};
  EXPECT_TRUE(mentions(expectInputError([&] { rankMicroBatchSamples(layout, 6, 0, 0); }),
                       "consumed_samples: expected a non-negative multiple of the micro-batch 4, got 6"));
  EXPECT_TRUE(mentions(expectInputError([&] { rankMicroBatchSamples(layout, -4, 0, 0); }), "consumed_samples"));
  EXPECT_TRUE(mentions(expectInputError([&] { rankMicroBatchSamples(layout, 0, 2, 0); }),
                       "micro-batch index: expected 0 to 1, got 2"));
  EXPECT_TRUE(mentions(expectInputError([&] { rankMicroBatchSamples(layout, 0, 0, 2); }),
                       "data parallel rank: expected 0 to 1, got 2"));
  EXPECT_TRUE(mentions(expectInputError([] { rankMicroBatchSamples({.microBatch = 3, .dataParallel = 2}, 0, 0, 0); }),
                       "micro-batch: expected a positive multiple of the data parallel size 2, got 3"));
  EXPECT_TRUE(mentions(expectInputError([] { rankMicroBatchSamples({.accumulation = 0}, 0, 0, 0); }),
                       "gradient accumulation: expected at least 1"));
}

}  // namespace
}  // namespace dgemma
