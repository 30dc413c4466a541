#include "runtime/data/batch/MicroBatchOrder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "support/Error.h"

namespace dgemma {
namespace {

// Items 0..n-1, every `every`-th one an image item.
std::vector<bool> mixed(int64_t n, int64_t every) {
  std::vector<bool> isImage(n);
  for (int64_t i = 0; i < n; ++i) isImage[i] = i % every == 0;
  return isImage;
}

TEST(MicroBatchOrder, EveryMicroBatchHasOneModality) {
  const std::vector<bool> isImage = mixed(23, 3);  // 8 image items, 15 text items
  MicroBatchOrder order(SamplerKind::Cyclic, isImage, 4, 5);
  int64_t imageBatches = 0;
  for (int64_t g = 0; g < 50; ++g) {
    const std::vector<int64_t> items = order.itemsAt(g);
    ASSERT_EQ(items.size(), 4u);
    for (int64_t item : items) EXPECT_EQ(isImage[item], order.imagesAt(g)) << "micro-batch " << g;
    imageBatches += order.imagesAt(g);
  }
  // m_image = 2, m_text = 4: a third of the micro-batches are image ones.
  EXPECT_EQ(order.microBatchesPerEpoch(), 6);
  EXPECT_EQ(imageBatches, 50 * 2 / 6);
}

// Each stream's epoch is a permutation of its items: consecutive |stream| samples of it, from an
// epoch boundary, visit every item once.
TEST(MicroBatchOrder, EachStreamEpochCoversAllItsItems) {
  const std::vector<bool> isImage = mixed(24, 4);  // 6 image items, 18 text items
  MicroBatchOrder order(SamplerKind::Cyclic, isImage, 3, 9);
  std::vector<int64_t> imageSamples, textSamples;
  for (int64_t g = 0; g < 8 * 4; ++g) {
    std::vector<int64_t>& stream = order.imagesAt(g) ? imageSamples : textSamples;
    for (int64_t item : order.itemsAt(g)) stream.push_back(item);
  }
  auto checkEpochs = [](const std::vector<int64_t>& samples, int64_t size) {
    for (size_t start = 0; start + size <= samples.size(); start += size) {
      std::vector<int64_t> epoch(samples.begin() + start, samples.begin() + start + size);
      std::sort(epoch.begin(), epoch.end());
      EXPECT_EQ(std::adjacent_find(epoch.begin(), epoch.end()), epoch.end()) << "a repeated item in one epoch";
    }
  };
  ASSERT_GE(imageSamples.size(), 12u);
  ASSERT_GE(textSamples.size(), 36u);
  checkEpochs(imageSamples, 6);
  checkEpochs(textSamples, 18);
  // The stream's epochs differ (a fresh permutation each).
  EXPECT_NE(std::vector<int64_t>(textSamples.begin(), textSamples.begin() + 18),
            std::vector<int64_t>(textSamples.begin() + 18, textSamples.begin() + 36));
}

// A resumed order (a fresh object asked from micro-batch g on) gives what the continuous one did.
TEST(MicroBatchOrder, DependsOnlyOnSeedAndIndex) {
  const std::vector<bool> isImage = mixed(17, 2);
  MicroBatchOrder continuous(SamplerKind::Cyclic, isImage, 2, 3);
  std::map<int64_t, std::vector<int64_t>> seen;
  for (int64_t g = 0; g < 40; ++g) seen[g] = continuous.itemsAt(g);
  for (int64_t resumeAt : {1, 7, 23}) {
    MicroBatchOrder resumed(SamplerKind::Cyclic, isImage, 2, 3);
    for (int64_t g = resumeAt; g < 40; ++g) EXPECT_EQ(resumed.itemsAt(g), seen[g]) << "resumed at " << resumeAt;
  }
  MicroBatchOrder otherSeed(SamplerKind::Cyclic, isImage, 2, 4);
  bool differs = false;
  for (int64_t g = 0; g < 40; ++g) differs |= otherSeed.itemsAt(g) != seen[g];
  EXPECT_TRUE(differs);
}

// One modality: exactly ItemOrder's samples, micro-batch after micro-batch.
TEST(MicroBatchOrder, OneModalityIsItemOrder) {
  for (bool images : {false, true}) {
    MicroBatchOrder order(SamplerKind::Cyclic, std::vector<bool>(13, images), 4, 21);
    ItemOrder items(SamplerKind::Cyclic, 13, 21);
    for (int64_t g = 0; g < 20; ++g) {
      EXPECT_EQ(order.imagesAt(g), images);
      const std::vector<int64_t> batch = order.itemsAt(g);
      for (int64_t slot = 0; slot < 4; ++slot) EXPECT_EQ(batch[slot], items.itemAt(g * 4 + slot));
    }
  }
}

// Single (evaluation): each stream in file order; one epoch's micro-batches cover every item, the
// last of a stream wrapping to its first items.
TEST(MicroBatchOrder, SingleCoversEveryItemInOneEpoch) {
  const std::vector<bool> isImage = {false, true, false, false, true, false, true};
  MicroBatchOrder order(SamplerKind::Single, isImage, 2, 0);
  ASSERT_EQ(order.microBatchesPerEpoch(), 4);  // text 4 items -> 2, image 3 items -> 2
  std::vector<std::vector<int64_t>> batches;
  for (int64_t g = 0; g < 4; ++g) batches.push_back(order.itemsAt(g));
  std::vector<std::vector<int64_t>> expected = {{0, 2}, {1, 4}, {3, 5}, {6, 1}};
  EXPECT_EQ(batches, expected);
}

TEST(MicroBatchOrder, RejectsEmptyItemsAndMicroBatches) {
  EXPECT_THROW(MicroBatchOrder(SamplerKind::Cyclic, {}, 2, 1), InputError);
  EXPECT_THROW(MicroBatchOrder(SamplerKind::Cyclic, {true}, 0, 1), InputError);
}

}  // namespace
}  // namespace dgemma
