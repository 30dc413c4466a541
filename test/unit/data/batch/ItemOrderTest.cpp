#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <set>

#include "support/Error.h"
#include "runtime/data/batch/ItemOrder.h"

namespace dgemma {
namespace {

std::vector<int64_t> epoch(ItemOrder& order, int64_t index) {
  std::vector<int64_t> items;
  for (int64_t i = 0; i < order.numItems(); ++i) items.push_back(order.itemAt(index * order.numItems() + i));
  return items;
}

TEST(ItemOrder, CyclicIsAPermutationPerEpochThatChangesAcrossEpochs) {
  ItemOrder order(SamplerKind::Cyclic, 100, 7);
  std::vector<int64_t> first = epoch(order, 0), second = epoch(order, 1);
  std::vector<int64_t> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(first, second);
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(first, identity);
}

// Resume: a fresh sampler asked from any consumed count gives what the first one gave.
TEST(ItemOrder, DependsOnlyOnSeedEpochAndPosition) {
  ItemOrder continuous(SamplerKind::Cyclic, 37, 11);
  std::vector<int64_t> expected;
  for (int64_t consumed = 0; consumed < 37 * 3; ++consumed) expected.push_back(continuous.itemAt(consumed));
  for (int64_t resumeAt : {0, 5, 37, 60}) {
    ItemOrder resumed(SamplerKind::Cyclic, 37, 11);
    for (int64_t consumed = resumeAt; consumed < 37 * 3; ++consumed) ASSERT_EQ(resumed.itemAt(consumed), expected[consumed]);
  }
  ItemOrder otherSeed(SamplerKind::Cyclic, 37, 12);
  EXPECT_NE(epoch(otherSeed, 0), epoch(continuous, 0));
}

TEST(ItemOrder, SingleIsSequential) {
  ItemOrder order(SamplerKind::Single, 4, 99);
  EXPECT_EQ(epoch(order, 0), (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(order.itemAt(6), 2);
}

TEST(ItemOrder, RejectsEmptyDatasetsAndNegativeCounts) {
  EXPECT_THROW(ItemOrder(SamplerKind::Cyclic, 0, 1), InputError);
  ItemOrder order(SamplerKind::Cyclic, 3, 1);
  EXPECT_THROW(order.itemAt(-1), InputError);
}

}  // namespace
}  // namespace dgemma
