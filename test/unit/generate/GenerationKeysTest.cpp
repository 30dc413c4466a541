#include <gtest/gtest.h>

#include <set>
#include <vector>

#include "runtime/core/NoiseKeys.h"
#include "runtime/generate/DrawSource.h"
#include "runtime/generate/GenerationKeys.h"

namespace dgemma {
namespace {

TEST(GenerationKeys, EveryPartOfTheSiteChangesTheSeed) {
  std::set<uint64_t> seeds;
  for (uint64_t run : {uint64_t{0}, uint64_t{1}})
    for (uint64_t request : {uint64_t{0}, uint64_t{1}, uint64_t{1} << 32})
      for (uint64_t canvas : {uint64_t{0}, uint64_t{1}})
        for (uint64_t step : {uint64_t{0}, uint64_t{1}, uint64_t{47}})
          for (DrawPurpose purpose : {DrawPurpose::InitialCanvas, DrawPurpose::Renoise, DrawPurpose::Sample})
            seeds.insert(generationDrawSeed(run, request, canvas, step, purpose));
  EXPECT_EQ(seeds.size(), 2u * 3 * 2 * 3 * 3);
  EXPECT_EQ(generationDrawSeed(5, 3, 2, 1, DrawPurpose::Renoise), generationDrawSeed(5, 3, 2, 1, DrawPurpose::Renoise));
}

TEST(GenerationKeys, NeverATrainingNoiseKey) {
  // Same run seed, small indices and steps: the training keys' counters never set bit 30 of the
  // last word, so the seeds differ.
  for (uint64_t index = 0; index < 4; ++index)
    for (uint64_t step = 0; step < 4; ++step)
      for (NoisePhase phase : {NoisePhase::Train, NoisePhase::Eval})
        for (DrawPurpose purpose : {DrawPurpose::InitialCanvas, DrawPurpose::Renoise, DrawPurpose::Sample})
          EXPECT_NE(static_cast<uint64_t>(noiseKey(7, phase, step, index)[0]), generationDrawSeed(7, index, 0, step, purpose));
}

TEST(GenerationKeys, SampleKeysStartAtCounterOffsetZero) {
  const std::array<int64_t, 2> key = sampleKey(9, 1, 2, 3);
  EXPECT_EQ(static_cast<uint64_t>(key[0]), generationDrawSeed(9, 1, 2, 3, DrawPurpose::Sample));
  EXPECT_EQ(key[1], 0);
}

TEST(GenerationKeys, UniformIdsCoverTheVocabularyEvenly) {
  // 7 is not a power of two (philoxInt rejects the words a modulo would favour), 128 is. Each id's
  // count over 10000 draws per id stays within 5% of the mean (a fair draw's deviation is ~1%).
  for (uint64_t vocab : {uint64_t{7}, uint64_t{128}}) {
    std::vector<int64_t> counts(vocab, 0);
    const int64_t draws = 10000 * static_cast<int64_t>(vocab);
    for (int64_t position = 0; position < draws; ++position) {
      const int64_t id = uniformTokenId(3, 0, 0, 0, DrawPurpose::InitialCanvas, position, vocab);
      ASSERT_GE(id, 0);
      ASSERT_LT(id, static_cast<int64_t>(vocab));
      ++counts[id];
    }
    for (uint64_t id = 0; id < vocab; ++id) {
      EXPECT_GT(counts[id], 9500) << "vocab " << vocab << " id " << id;
      EXPECT_LT(counts[id], 10500) << "vocab " << vocab << " id " << id;
    }
  }
}

TEST(CounterDrawSource, DrawsArePureFunctionsOfTheSite) {
  CounterDrawSource draws(11, 128), again(11, 128), otherSeed(12, 128);
  std::vector<int64_t> a(16), b(16), c(16), d(16);
  draws.initialCanvas(2, 1, a);
  again.initialCanvas(2, 1, b);
  otherSeed.initialCanvas(2, 1, c);
  draws.renoiseIds({2, 1, 0}, d);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);  // the initial canvas and step 0's renoise ids are different streams
  for (size_t p = 0; p < a.size(); ++p) EXPECT_EQ(a[p], uniformTokenId(11, 2, 1, 0, DrawPurpose::InitialCanvas, p, 128));
  EXPECT_EQ(draws.sampleKey({2, 1, 5}), sampleKey(11, 2, 1, 5));
}

}  // namespace
}  // namespace dgemma
