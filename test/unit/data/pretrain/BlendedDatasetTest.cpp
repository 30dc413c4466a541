#include <gtest/gtest.h>

#include <algorithm>

#include "runtime/data/pretrain/BlendedDataset.h"
#include "runtime/data/pretrain/SampleBatches.h"
#include "test/unit/TestSupport.h"
#include "test/unit/data/pretrain/PretrainTestCorpus.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::kTokenDocumentStride;
using test::makeSource;
using test::mentions;

// The rule checked step by step: the chosen source has the largest w·max(i, 1) − taken (the first
// of equal ones, as std::max_element returns), and every source stays within one sample of its
// share.
void expectGreedyRule(const std::vector<double>& weights, int64_t samples) {
  const std::vector<int64_t> order = greedyBlendOrder(weights, samples);
  ASSERT_EQ(static_cast<int64_t>(order.size()), samples);
  std::vector<double> taken(weights.size(), 0);
  for (int64_t i = 0; i < samples; ++i) {
    std::vector<double> deficits;
    for (size_t k = 0; k < weights.size(); ++k)
      deficits.push_back(weights[k] * std::max(static_cast<double>(i), 1.0) - taken[k]);
    ASSERT_EQ(order[i], std::max_element(deficits.begin(), deficits.end()) - deficits.begin()) << "sample " << i;
    taken[order[i]] += 1;
    for (size_t k = 0; k < weights.size(); ++k) ASSERT_LE(std::abs(taken[k] - weights[k] * (i + 1)), 1.0);
  }
}

TEST(BlendedDataset, TheBlendOrderFollowsTheGreedyRule) {
  expectGreedyRule({0.7, 0.3}, 1000);
  expectGreedyRule({0.5, 0.25, 0.25}, 997);
  expectGreedyRule({0.01, 0.99}, 500);
  // Equal weights: ties go to the lower index.
  EXPECT_EQ(greedyBlendOrder({0.5, 0.5}, 6), (std::vector<int64_t>{0, 1, 0, 1, 0, 1}));
  // By hand: deficits (0.7, 0.3), (−0.3, 0.3), (0.4, −0.4), (0.1, −0.1), (−0.2, 0.2), ...; the same
  // as megatron-core's build_blending_indices gives.
  EXPECT_EQ(greedyBlendOrder({0.7, 0.3}, 10), (std::vector<int64_t>{0, 1, 0, 0, 1, 0, 0, 1, 0, 0}));
}

BlendOptions blendOptions(int64_t samples, uint64_t seed = 11) {
  return {.sequenceLength = 8, .seed = seed, .numSamples = samples, .split = parseSplit("969,30,1")};
}

std::vector<BlendSource> threeSources() {
  return {{makeSource(60, 25, "", 1), 2.0}, {makeSource(40, 40, "", 2), 1.0}, {makeSource(80, 10, "", 3), 1.0}};
}

TEST(BlendedDataset, SamplesComeFromTheirSourceInProportion) {
  const std::vector<BlendSource> sources = threeSources();
  const int64_t samples = 400;
  BlendedDataset blend(sources, blendOptions(samples), nullptr);
  ASSERT_EQ(blend.size(), samples);
  EXPECT_EQ(blend.normalizedWeights(), (std::vector<double>{0.5, 0.25, 0.25}));
  std::vector<int64_t> taken(3, 0);
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t k = blend.sourceAt(i);
    EXPECT_EQ(blend.sourceSampleAt(i), taken[k]++);
    EXPECT_EQ(blend.sample(i).tokens, blend.source(k).sample(blend.sourceSampleAt(i)).tokens);
  }
  EXPECT_EQ(taken, (std::vector<int64_t>{200, 100, 100}));
  for (int64_t k = 0; k < 3; ++k) {
    // megatron-core's surplus: ceil(ceil(N · w) · 1.005) samples asked of each source (201, 101, 101
    // here), from its train part.
    const PackedDataset& source = blend.source(k);
    EXPECT_EQ(source.requestedSamples(), k == 0 ? 201 : 101);
    const DocumentRange train = splitDocumentRanges(parseSplit("969,30,1"), source.source().sequenceCount())[0];
    for (int64_t document : source.documentOrder()) {
      ASSERT_GE(document, train.begin);
      ASSERT_LT(document, train.end);
    }
  }
}

TEST(BlendedDataset, OtherSplitPartsReadOtherDocuments) {
  const std::vector<BlendSource> sources = {{makeSource(200, 20, "", 1), 1.0}};
  BlendOptions validation = blendOptions(30);
  validation.split = parseSplit("8,2,0");  // [0, 160), [160, 200), none
  validation.part = SplitPart::Validation;
  BlendedDataset blend(sources, validation, nullptr);
  for (int64_t document : blend.source(0).documentOrder()) EXPECT_GE(document, 160);
  for (int64_t i = 0; i < blend.size(); ++i)
    for (int64_t token : blend.sample(i).tokens) EXPECT_GE(token / kTokenDocumentStride, 160);

  validation.part = SplitPart::Test;
  EXPECT_TRUE(mentions(expectInputError([&] { BlendedDataset(sources, validation, nullptr); }),
                       ": --split 8,2,0 gives the test part none of its 200 documents"));
}

TEST(BlendedDataset, BadBlendsAreInputErrors) {
  EXPECT_TRUE(mentions(expectInputError([] { BlendedDataset({}, blendOptions(10), nullptr); }), "at least one source"));
  const auto source = makeSource(20, 10);
  EXPECT_TRUE(mentions(expectInputError([&] { BlendedDataset({{source, 0.0}}, blendOptions(10), nullptr); }),
                       "expected a blend weight > 0, got 0"));
  BlendOptions noTokens = blendOptions(10);
  noTokens.sequenceLength = 0;
  EXPECT_TRUE(mentions(expectInputError([&] { BlendedDataset({{source, 1.0}}, noTokens, nullptr); }),
                       "sequence length: expected at least 1 token, got 0"));
  BlendedDataset blend({{source, 1.0}}, blendOptions(10), nullptr);
  EXPECT_TRUE(mentions(expectInputError([&] { blend.sample(10); }), "blend: sample 10 outside its 10 samples"));
}

// What a run of `steps` steps feeds, step by step, under a layout: each rank's rows of each
// micro-batch, the ranks' boxes put back together in rank order.
std::vector<std::vector<int64_t>> runSamples(const SampleBatchLayout& layout, int64_t firstStep, int64_t steps) {
  std::vector<std::vector<int64_t>> perStep;
  for (int64_t step = firstStep; step < firstStep + steps; ++step) {
    std::vector<int64_t> samples;
    for (int64_t micro = 0; micro < layout.accumulation; ++micro)
      for (int64_t rank = 0; rank < layout.dataParallel; ++rank) {
        const std::vector<int64_t> rows = rankMicroBatchSamples(layout, step * layout.globalBatch(), micro, rank);
        samples.insert(samples.end(), rows.begin(), rows.end());
      }
    perStep.push_back(samples);
  }
  return perStep;
}

std::vector<std::vector<int64_t>> tokensOf(const BlendedDataset& blend,
                                           const std::vector<std::vector<int64_t>>& steps) {
  std::vector<std::vector<int64_t>> tokens;
  for (const std::vector<int64_t>& step : steps)
    for (int64_t sample : step) tokens.push_back(blend.sample(sample).tokens);
  return tokens;
}

// DP=2 reads, per step, exactly the samples one rank reads for the same global batch, and each
// sample's tokens are the same in a blend opened by another process (a fresh object).
TEST(BlendedDataset, DataParallelRanksTogetherReadWhatOneRankReads) {
  const std::vector<BlendSource> sources = threeSources();
  const BlendedDataset oneRankBlend(sources, blendOptions(240), nullptr);
  const BlendedDataset twoRankBlend(sources, blendOptions(240), nullptr);
  const SampleBatchLayout oneRank{.microBatch = 4, .accumulation = 3, .dataParallel = 1};
  const SampleBatchLayout twoRanks{.microBatch = 4, .accumulation = 3, .dataParallel = 2};
  const std::vector<std::vector<int64_t>> single = runSamples(oneRank, 0, 20), split = runSamples(twoRanks, 0, 20);
  EXPECT_EQ(single, split);
  EXPECT_EQ(tokensOf(oneRankBlend, single), tokensOf(twoRankBlend, split));
  // And the ranks' boxes do not overlap within a micro-batch.
  EXPECT_EQ(rankMicroBatchSamples(twoRanks, 24, 1, 0), (std::vector<int64_t>{28, 29}));
  EXPECT_EQ(rankMicroBatchSamples(twoRanks, 24, 1, 1), (std::vector<int64_t>{30, 31}));
}

// A run stopped after 7 steps and resumed from its consumed samples, in another layout of the same
// global batch and with freshly opened datasets, reads the uninterrupted run's samples.
TEST(BlendedDataset, ResumeFromConsumedSamplesContinuesTheUninterruptedOrder) {
  const std::vector<BlendSource> sources = threeSources();
  const SampleBatchLayout layout{.microBatch = 4, .accumulation = 2, .dataParallel = 1};
  const std::vector<std::vector<int64_t>> uninterrupted = runSamples(layout, 0, 20);
  const BlendedDataset continuous(sources, blendOptions(160), nullptr);

  const SampleBatchLayout resumedLayout{.microBatch = 2, .accumulation = 4, .dataParallel = 2};
  const std::vector<std::vector<int64_t>> before = runSamples(layout, 0, 7), after = runSamples(resumedLayout, 7, 13);
  std::vector<std::vector<int64_t>> resumed = before;
  resumed.insert(resumed.end(), after.begin(), after.end());
  EXPECT_EQ(resumed, uninterrupted);
  const BlendedDataset reopened(sources, blendOptions(160), nullptr);
  EXPECT_EQ(tokensOf(reopened, after),
            tokensOf(continuous, std::vector(uninterrupted.begin() + 7, uninterrupted.end())));
}

}  // namespace
}  // namespace dgemma
