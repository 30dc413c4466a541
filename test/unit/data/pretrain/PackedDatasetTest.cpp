#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <sstream>

#include "runtime/data/pretrain/PackedDataset.h"
#include "test/unit/TestSupport.h"
#include "test/unit/data/pretrain/PretrainTestCorpus.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::kTokenDocumentStride;
using test::makeSource;
using test::mentions;

PackedDatasetOptions options(int64_t sequenceLength, int64_t numSamples, DocumentRange documents,
                             uint64_t seed = 1234) {
  return {.sequenceLength = sequenceLength, .seed = seed, .numSamples = numSamples, .documents = documents};
}

// Sample j before the shuffle: the index i with sampleOrder[i] == j.
std::vector<int64_t> inverse(const std::vector<int64_t>& order) {
  std::vector<int64_t> result(order.size());
  for (size_t i = 0; i < order.size(); ++i) result[order[i]] = static_cast<int64_t>(i);
  return result;
}

// Every sample is the stream of the document order's tokens from j·S, S + 1 tokens long, and each
// position's document, offset, segment and end flag agree with the token's origin.
TEST(PackedDataset, SamplesCutTheDocumentStreamWithAnOverlapToken) {
  const auto source = makeSource(40, 37);
  const int64_t S = 16;
  const DocumentRange range{3, 35};
  PackedDataset dataset(source, options(S, 100, range), nullptr);

  std::vector<int64_t> stream;
  for (int64_t document : dataset.documentOrder()) {
    std::vector<int64_t> tokens;
    source->readTokens(document, 0, source->sequenceLength(document), tokens);
    stream.insert(stream.end(), tokens.begin(), tokens.end());
  }
  const std::vector<int64_t> position = inverse(dataset.sampleOrder());
  for (int64_t j = 0; j < dataset.size(); ++j) {
    const PackedSample sample = dataset.sample(position[j]);
    ASSERT_EQ(static_cast<int64_t>(sample.tokens.size()), S + 1);
    ASSERT_EQ(sample.segmentIds.size(), sample.tokens.size());
    ASSERT_EQ(sample.positionIds.size(), sample.tokens.size());
    ASSERT_EQ(sample.endsDocument.size(), sample.tokens.size());
    ASSERT_TRUE(std::equal(sample.tokens.begin(), sample.tokens.end(), stream.begin() + j * S)) << "sample " << j;
    for (int64_t k = 0; k <= S; ++k) {
      const int64_t document = sample.tokens[k] / kTokenDocumentStride,
                    offset = sample.tokens[k] % kTokenDocumentStride;
      EXPECT_EQ(sample.positionIds[k], offset);
      EXPECT_EQ(sample.segmentDocuments[sample.segmentIds[k]], document);
      EXPECT_EQ(sample.endsDocument[k], offset == source->sequenceLength(document) - 1 ? 1 : 0);
      // A new segment starts exactly where a document ended (or at a document's first token).
      if (k > 0) {
        EXPECT_EQ(sample.segmentIds[k], sample.segmentIds[k - 1] + (sample.endsDocument[k - 1] ? 1 : 0));
      }
    }
    EXPECT_EQ(sample.segmentIds[0], 0);
    EXPECT_EQ(static_cast<int64_t>(sample.segmentDocuments.size()), sample.segmentIds[S] + 1);
    const std::vector<float> mask = autoregressiveLossMask(sample);
    ASSERT_EQ(static_cast<int64_t>(mask.size()), S);
    for (int64_t k = 0; k < S; ++k)
      EXPECT_EQ(mask[k], sample.tokens[k + 1] / kTokenDocumentStride == sample.tokens[k] / kTokenDocumentStride &&
                                 sample.positionIds[k + 1] == sample.positionIds[k] + 1
                             ? 1.0f
                             : 0.0f);
    // The overlap: the last token of sample j is the first of sample j + 1.
    if (j + 1 < dataset.size()) {
      EXPECT_EQ(sample.tokens[S], dataset.sample(position[j + 1]).tokens[0]);
    }
  }
  // A document carried over into a sample starts above position 0 there.
  bool sawContinuation = false;
  for (int64_t i = 0; i < dataset.size(); ++i) sawContinuation |= dataset.sample(i).positionIds[0] > 0;
  EXPECT_TRUE(sawContinuation);
}

TEST(PackedDataset, EpochsCoverTheRequestedSamplesAndEachIsAPermutationOfTheSplit) {
  const auto source = makeSource(30, 25);
  const DocumentRange range{5, 25};
  int64_t tokens = 0;
  for (int64_t d = range.begin; d < range.end; ++d) tokens += source->sequenceLength(d);
  for (int64_t samples : {1, 7, 40, 123}) {
    const int64_t S = 11;
    PackedDataset dataset(source, options(S, samples, range), nullptr);
    const int64_t epochs = dataset.epochs();
    // The fewest epochs with E·T >= N·S + 1.
    EXPECT_GE(epochs * tokens, samples * S + 1);
    EXPECT_LT((epochs - 1) * tokens, samples * S + 1);
    EXPECT_EQ(dataset.size(), (epochs * tokens - 1) / S);
    EXPECT_GE(dataset.size(), samples);
    ASSERT_EQ(static_cast<int64_t>(dataset.documentOrder().size()), epochs * range.size());
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      std::vector<int64_t> documents(dataset.documentOrder().begin() + epoch * range.size(),
                                     dataset.documentOrder().begin() + (epoch + 1) * range.size());
      std::sort(documents.begin(), documents.end());
      std::vector<int64_t> expected(range.size());
      std::iota(expected.begin(), expected.end(), range.begin);
      EXPECT_EQ(documents, expected) << "epoch " << epoch;
    }
    std::vector<int64_t> order = dataset.sampleOrder();
    std::sort(order.begin(), order.end());
    for (int64_t i = 0; i < dataset.size(); ++i) ASSERT_EQ(order[i], i);
  }
}

// N·S + 1 tokens exactly one epoch: one epoch is enough, and the last sample ends on its last token.
TEST(PackedDataset, SamplesThatFillAnEpochExactlyNeedNoSecondEpoch) {
  const auto source =
      std::make_shared<InMemoryDocuments>(std::vector<std::vector<int64_t>>{{0, 1, 2}, {}, {10, 11, 12, 13}});
  PackedDataset dataset(source, options(3, 2, {0, 3}), nullptr);
  EXPECT_EQ(dataset.epochs(), 1);
  ASSERT_EQ(dataset.size(), 2);
  const std::vector<int64_t> position = inverse(dataset.sampleOrder());
  const PackedSample first = dataset.sample(position[0]), second = dataset.sample(position[1]);
  EXPECT_EQ(first.tokens[3], second.tokens[0]);
  std::vector<int64_t> all = first.tokens;
  all.insert(all.end(), second.tokens.begin() + 1, second.tokens.end());
  EXPECT_TRUE(second.endsDocument[3]);
  std::sort(all.begin(), all.end());
  EXPECT_EQ(all, (std::vector<int64_t>{0, 1, 2, 10, 11, 12, 13}));
  PackedDataset oneMore(source, options(3, 3, {0, 3}), nullptr);
  EXPECT_EQ(oneMore.epochs(), 2);
}

// Only the split's documents appear, each in every epoch with all its tokens in order.
TEST(PackedDataset, EveryTokenOfEveryDocumentAppearsInOrder) {
  const auto source = makeSource(12, 9);
  const DocumentRange range{2, 10};
  const int64_t S = 5;
  PackedDataset dataset(source, options(S, 60, range), nullptr);
  const std::vector<int64_t> position = inverse(dataset.sampleOrder());
  std::vector<int64_t> stream;  // the samples unshuffled, the overlap token once
  for (int64_t j = 0; j < dataset.size(); ++j) {
    const PackedSample sample = dataset.sample(position[j]);
    stream.insert(stream.end(), sample.tokens.begin(), sample.tokens.end() - (j + 1 < dataset.size() ? 1 : 0));
  }
  int64_t next = 0;
  for (int64_t document : dataset.documentOrder()) {
    ASSERT_GE(document, range.begin);
    ASSERT_LT(document, range.end);
    for (int64_t offset = 0; offset < source->sequenceLength(document) && next < static_cast<int64_t>(stream.size());
         ++offset, ++next)
      ASSERT_EQ(stream[next], kTokenDocumentStride * document + offset);
  }
  EXPECT_EQ(next, static_cast<int64_t>(stream.size()));
  EXPECT_EQ(static_cast<int64_t>(stream.size()), dataset.size() * S + 1);
}

TEST(PackedDataset, ShuffleIsDeterministicAndSeedSensitive) {
  const auto source = makeSource(50, 30);
  const DocumentRange range{0, 50};
  PackedDataset first(source, options(8, 200, range, 7), nullptr);
  PackedDataset again(source, options(8, 200, range, 7), nullptr);
  PackedDataset otherSeed(source, options(8, 200, range, 8), nullptr);
  EXPECT_EQ(first.documentOrder(), again.documentOrder());
  EXPECT_EQ(first.sampleOrder(), again.sampleOrder());
  for (int64_t i = 0; i < first.size(); i += 17) EXPECT_EQ(first.sample(i).tokens, again.sample(i).tokens);
  EXPECT_NE(first.documentOrder(), otherSeed.documentOrder());
  EXPECT_NE(first.sampleOrder(), otherSeed.sampleOrder());
  // Epochs are shuffled independently.
  ASSERT_GE(first.epochs(), 2);
  EXPECT_FALSE(std::equal(first.documentOrder().begin(), first.documentOrder().begin() + 50,
                          first.documentOrder().begin() + 50));
}

TEST(PackedDataset, BadOptionsAreInputErrors) {
  const auto source = makeSource(10, 5);
  EXPECT_TRUE(mentions(expectInputError([&] { PackedDataset(source, options(0, 10, {0, 10}), nullptr); }),
                       "sequence length: expected at least 1 token, got 0"));
  EXPECT_TRUE(mentions(expectInputError([&] { PackedDataset(source, options(4, 0, {0, 10}), nullptr); }),
                       "number of samples: expected at least 1, got 0"));
  EXPECT_TRUE(mentions(expectInputError([&] { PackedDataset(source, options(4, 10, {0, 11}), nullptr); }),
                       "documents [0, 11) outside its 10 documents"));
  const auto empty = std::make_shared<InMemoryDocuments>(std::vector<std::vector<int64_t>>{{}, {}});
  EXPECT_TRUE(mentions(expectInputError([&] { PackedDataset(empty, options(4, 10, {0, 2}), nullptr); }),
                       "documents [0, 2) hold no tokens to pack"));
  PackedDataset dataset(source, options(4, 3, {0, 10}), nullptr);
  EXPECT_TRUE(mentions(expectInputError([&] { dataset.sample(dataset.size()); }), "outside its"));
}

}  // namespace
}  // namespace dgemma
