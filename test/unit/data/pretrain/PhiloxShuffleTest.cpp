#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>

#include "runtime/core/Philox.h"
#include "runtime/data/pretrain/PhiloxShuffle.h"

namespace dgemma {
namespace {

// The draw as docs/pretraining.md states it, for bounds small enough that no word is
// rejected in these tests: floor(x · bound / 2^64) of x = the first two words.
uint64_t documentedDraw(uint64_t seed, uint32_t purpose, uint32_t epoch, uint64_t draw, uint64_t bound) {
  const PhiloxCounter words =
      philox4x32x10({static_cast<uint32_t>(draw), static_cast<uint32_t>(draw >> 32), epoch, purpose << 24},
                    {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)});
  const uint64_t x = static_cast<uint64_t>(words[0]) | (static_cast<uint64_t>(words[1]) << 32);
  return static_cast<uint64_t>((static_cast<unsigned __int128>(x) * bound) >> 64);
}

TEST(PhiloxShuffle, IsTheDocumentedFisherYates) {
  const uint64_t seed = 0x123456789abcdefULL;
  std::vector<int64_t> expected(50);
  std::iota(expected.begin(), expected.end(), 100);
  std::vector<int64_t> shuffled = expected;
  for (uint64_t i = expected.size() - 1; i >= 1; --i)
    std::swap(expected[i], expected[documentedDraw(seed, 1, 7, expected.size() - 1 - i, i + 1)]);
  philoxShuffle(shuffled, seed, ShufflePurpose::DocumentOrder, 7);
  EXPECT_EQ(shuffled, expected);
}

TEST(PhiloxShuffle, DependsOnSeedPurposeAndEpoch) {
  std::vector<int64_t> base(64);
  std::iota(base.begin(), base.end(), 0);
  auto shuffle = [&](uint64_t seed, ShufflePurpose purpose, uint32_t epoch) {
    std::vector<int64_t> values = base;
    philoxShuffle(values, seed, purpose, epoch);
    return values;
  };
  const std::vector<int64_t> reference = shuffle(1, ShufflePurpose::DocumentOrder, 0);
  EXPECT_EQ(shuffle(1, ShufflePurpose::DocumentOrder, 0), reference);
  EXPECT_NE(reference, base);
  EXPECT_NE(shuffle(2, ShufflePurpose::DocumentOrder, 0), reference);
  EXPECT_NE(shuffle(1, ShufflePurpose::SampleOrder, 0), reference);
  EXPECT_NE(shuffle(1, ShufflePurpose::DocumentOrder, 1), reference);
  std::vector<int64_t> sorted = reference;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, base);
}

// All 24 orders of 4 items, each about 1/24 of 24,000 epochs: a biased draw (say, a modulo of a
// small word, or an off-by-one in the Fisher–Yates bound that never leaves an item in place) fails.
TEST(PhiloxShuffle, EveryOrderIsEquallyLikely) {
  std::map<std::vector<int64_t>, int> counts;
  const int epochs = 24000;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::vector<int64_t> values = {0, 1, 2, 3};
    philoxShuffle(values, 99, ShufflePurpose::SampleOrder, static_cast<uint32_t>(epoch));
    ++counts[values];
  }
  ASSERT_EQ(counts.size(), 24u);
  double chiSquare = 0;
  for (const auto& [order, count] : counts) chiSquare += (count - 1000.0) * (count - 1000.0) / 1000.0;
  EXPECT_LT(chiSquare, 49.7);  // the 0.999 quantile of chi-square with 23 degrees of freedom
}

TEST(PhiloxShuffle, DrawsStayBelowTheBound) {
  for (uint64_t bound : {uint64_t{1}, uint64_t{3}, uint64_t{1} << 40, ~uint64_t{0}})
    for (uint64_t draw = 0; draw < 200; ++draw)
      EXPECT_LT(philoxBelow(5, ShufflePurpose::SampleOrder, 0, draw, bound), bound);
}

}  // namespace
}  // namespace dgemma
