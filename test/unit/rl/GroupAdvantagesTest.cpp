// The prompt order and the group-normalised advantages of a GRPO step (runtime/rl/GroupAdvantages.h).
#include "runtime/rl/GroupAdvantages.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>

namespace dgemma {
namespace {

TEST(GroupAdvantagesTest, EachGroupIsNormalisedByItsOwnMeanAndUnbiasedDeviation) {
  const std::vector<double> advantages = groupAdvantages({1, 0, 0, 1, /*second group*/ 2, 4, 6, 8}, 4);
  // Group 1: mean 0.5, unbiased std sqrt(1/3).
  const double first = 0.5 / (std::sqrt(1.0 / 3.0) + 1e-4);
  EXPECT_DOUBLE_EQ(advantages[0], first);
  EXPECT_DOUBLE_EQ(advantages[1], -first);
  // Group 2: mean 5, unbiased std sqrt(20/3).
  const double deviation = std::sqrt(20.0 / 3.0) + 1e-4;
  EXPECT_DOUBLE_EQ(advantages[4], -3 / deviation);
  EXPECT_DOUBLE_EQ(advantages[7], 3 / deviation);
}

TEST(GroupAdvantagesTest, AGroupOfEqualRewardsHasNoAdvantageAtAll) {
  for (double reward : {0.0, 1.0, 0.1, 1e-300})
    for (double advantage : groupAdvantages({reward, reward, reward}, 3)) EXPECT_EQ(advantage, 0.0) << reward;
}

TEST(GroupAdvantagesTest, RejectsGroupsOfOneAndRaggedGroups) {
  EXPECT_THROW(groupAdvantages({1, 2}, 1), std::invalid_argument);
  EXPECT_THROW(groupAdvantages({1, 2, 3}, 2), std::invalid_argument);
}

TEST(GroupAdvantagesTest, ANegativeScaleShrinksOnlyTheNegativeAdvantages) {
  const std::vector<double> grpo = groupAdvantages({1, 0, 0, 1, 2, 4, 6, 8}, 4);
  for (double scale : {0.0, 0.25, 1.0}) {
    std::vector<double> scaled = grpo;
    scaleNegativeAdvantages(scaled, scale);
    for (size_t i = 0; i < grpo.size(); ++i)
      EXPECT_EQ(scaled[i], grpo[i] < 0 ? grpo[i] * scale : grpo[i]) << "scale " << scale << ", rollout " << i;
  }
  std::vector<double> any = grpo;
  EXPECT_THROW(scaleNegativeAdvantages(any, -0.5), std::invalid_argument);
  EXPECT_THROW(scaleNegativeAdvantages(any, 1.5), std::invalid_argument);
  EXPECT_THROW(scaleNegativeAdvantages(any, std::nan("")), std::invalid_argument);
}

TEST(PromptOrderTest, EveryEpochVisitsEveryPromptOnceInItsOwnOrder) {
  PromptOrder order(10, 42);
  std::vector<int64_t> first, second;
  for (int64_t i = 0; i < 10; ++i) first.push_back(order.promptAt(i));
  for (int64_t i = 10; i < 20; ++i) second.push_back(order.promptAt(i));
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), 10u);
  EXPECT_EQ(std::set<int64_t>(second.begin(), second.end()).size(), 10u);
  EXPECT_NE(first, second);
  // A fresh order (a resumed run) that starts mid-way agrees with the one that got there.
  PromptOrder resumed(10, 42);
  EXPECT_EQ(resumed.promptAt(13), second[3]);
  EXPECT_EQ(resumed.promptAt(2), first[2]);
  // Another seed, another order.
  PromptOrder other(10, 43);
  std::vector<int64_t> otherFirst;
  for (int64_t i = 0; i < 10; ++i) otherFirst.push_back(other.promptAt(i));
  EXPECT_NE(otherFirst, first);
}

}  // namespace
}  // namespace dgemma
