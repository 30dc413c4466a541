#include <gtest/gtest.h>

#include <vector>

#include "runtime/generate/StopRule.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using Ids = std::vector<int64_t>;

TEST(StopRule, TheFirstPassIsNeverStableAndThenTheArgmaxMustRepeat) {
  StopRule rule(1, 0.005, 2);
  EXPECT_FALSE(rule.updateStable(Ids{3, 4}));  // the history starts at -1
  EXPECT_TRUE(rule.updateStable(Ids{3, 4}));
  EXPECT_FALSE(rule.updateStable(Ids{3, 5}));
  EXPECT_TRUE(rule.updateStable(Ids{3, 5}));
  rule.reset();
  EXPECT_FALSE(rule.updateStable(Ids{3, 5}));
}

TEST(StopRule, AThresholdOfTwoWantsTheSameArgmaxThreePassesInARow) {
  StopRule rule(2, 0.005, 2);
  EXPECT_FALSE(rule.updateStable(Ids{1, 2}));
  EXPECT_FALSE(rule.updateStable(Ids{1, 2}));
  EXPECT_TRUE(rule.updateStable(Ids{1, 2}));
  EXPECT_FALSE(rule.updateStable(Ids{1, 3}));
  EXPECT_FALSE(rule.updateStable(Ids{1, 2}));  // [1, 3] is still in the history
  EXPECT_FALSE(rule.updateStable(Ids{1, 2}));
  EXPECT_TRUE(rule.updateStable(Ids{1, 2}));
}

TEST(StopRule, ThresholdZeroIsAlwaysStable) {
  StopRule rule(0, 0.005, 2);
  EXPECT_TRUE(rule.updateStable(Ids{1, 2}));
  EXPECT_TRUE(rule.updateStable(Ids{7, 8}));
}

TEST(StopRule, ConfidentWhenTheMeanEntropyIsStrictlyBelowTheThreshold) {
  StopRule rule(1, 0.005, 2);
  EXPECT_TRUE(rule.confident(std::vector<float>{0.001f, 0.008f}));   // 0.0045
  EXPECT_FALSE(rule.confident(std::vector<float>{0.002f, 0.009f}));  // 0.0055
  EXPECT_FALSE(rule.confident(std::vector<float>{0.005f, 0.005f}));  // equal is not below
}

TEST(StopRule, StopsWhenStableAndConfident) {
  StopRule rule(1, 0.005, 2);
  const std::vector<float> sure = {0.0f, 0.001f}, unsure = {1.0f, 2.0f};
  EXPECT_FALSE(rule.shouldStop(Ids{3, 4}, sure));    // confident, not stable
  EXPECT_FALSE(rule.shouldStop(Ids{3, 4}, unsure));  // stable, not confident (the history still moves)
  EXPECT_TRUE(rule.shouldStop(Ids{3, 4}, sure));
}

TEST(StopRule, RejectsANegativeThreshold) {
  EXPECT_TRUE(test::mentions(test::expectInputError([] { StopRule(-1, 0.005, 2); }), "stability_threshold"));
}

}  // namespace
}  // namespace dgemma
