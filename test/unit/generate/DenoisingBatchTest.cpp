#include <gtest/gtest.h>

#include <vector>

#include "runtime/generate/DenoisingBatch.h"

namespace dgemma {
namespace {

using Ids = std::vector<int64_t>;
using Mask = std::vector<uint8_t>;

GenerationSettings settings(int64_t stabilityThreshold = 1) {
  GenerationSettings s;
  s.canvasLength = 3;
  s.maxDenoisingSteps = 8;
  s.entropyBound = 0.1;
  s.stabilityThreshold = stabilityThreshold;
  s.confidenceThreshold = 0.5;
  return s;
}

// The renoise draws: row r's rejected positions get 90 + 10 r + position; every call is recorded.
struct Renoise {
  std::vector<int64_t> calls;
  DenoisingBatch::RenoiseDraw draw() {
    return [this](int64_t row, std::span<int64_t> ids) {
      calls.push_back(row);
      for (size_t p = 0; p < ids.size(); ++p) ids[p] = 90 + 10 * row + static_cast<int64_t>(p);
    };
  }
};

TEST(DenoisingBatch, AcceptsSamplesRenoisesTheRestAndFreezesRowsThatStop) {
  DenoisingBatch batch(settings(), 2);
  batch.startCanvas({1, 1}, Ids{11, 12, 13, 21, 22, 23});
  EXPECT_EQ(batch.argmaxCanvas(), (Ids{11, 12, 13, 21, 22, 23}));  // transformers starts it at the canvas
  EXPECT_EQ(batch.frozen(), (Mask{0, 0}));
  Renoise renoise;

  // Pass 1. Row 0: sums before 0, 0.05, 0.13: positions 0 and 1 take the samples, 2 is renoised.
  // Row 1: all certain, all accepted. The first pass is never stable.
  Mask accepted = batch.applyPass(Ids{1, 2, 3, 4, 5, 6}, Ids{7, 8, 9, 4, 5, 6},
                                  std::vector<float>{0.05f, 0.08f, 0.3f, 0.0f, 0.0f, 0.0f}, renoise.draw());
  EXPECT_EQ(accepted, (Mask{1, 1, 0, 1, 1, 1}));
  EXPECT_EQ(batch.canvas(), (Ids{1, 2, 92, 4, 5, 6}));
  EXPECT_EQ(batch.argmaxCanvas(), (Ids{7, 8, 9, 4, 5, 6}));
  EXPECT_EQ(batch.frozen(), (Mask{0, 0}));

  // Pass 2: row 0 repeats its argmax with a mean entropy below 0.5 and stops; row 1 changes.
  accepted = batch.applyPass(Ids{7, 8, 9, 4, 5, 6}, Ids{7, 8, 9, 4, 5, 0},
                             std::vector<float>{0.0f, 0.0f, 0.6f, 0.0f, 0.0f, 0.0f}, renoise.draw());
  EXPECT_EQ(accepted, (Mask{1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(batch.frozen(), (Mask{1, 0}));
  EXPECT_EQ(batch.canvas(), (Ids{7, 8, 9, 4, 5, 6}));

  // Pass 3: row 0 is frozen: whatever the decoder says, its canvas and argmax stay, nothing is
  // accepted, it draws no renoise ids and counts no pass. Row 1 repeats and stops.
  accepted = batch.applyPass(Ids{60, 61, 62, 4, 5, 0}, Ids{63, 64, 65, 4, 5, 0},
                             std::vector<float>{9.0f, 9.0f, 9.0f, 0.0f, 0.0f, 0.0f}, renoise.draw());
  EXPECT_EQ(accepted, (Mask{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(batch.canvas(), (Ids{7, 8, 9, 4, 5, 0}));
  EXPECT_EQ(batch.argmaxCanvas(), (Ids{7, 8, 9, 4, 5, 0}));
  EXPECT_EQ(batch.frozen(), (Mask{1, 1}));
  EXPECT_TRUE(batch.allFrozen());
  EXPECT_EQ(batch.passes(0), 2);
  EXPECT_EQ(batch.passes(1), 3);
  EXPECT_EQ(renoise.calls, (std::vector<int64_t>{0, 1, 0, 1, 1}));
}

TEST(DenoisingBatch, StabilityCountsTheFrozenArgmaxAndRestartsEveryCanvas) {
  DenoisingBatch batch(settings(2), 1);
  Renoise renoise;
  const std::vector<float> sure = {0.0f, 0.0f, 0.0f};
  batch.startCanvas({1}, Ids{0, 0, 0});
  // Threshold 2: the argmax must equal the two before it, so the third equal pass stops.
  for (int pass = 0; pass < 2; ++pass) {
    batch.applyPass(Ids{1, 2, 3}, Ids{1, 2, 3}, sure, renoise.draw());
    EXPECT_FALSE(batch.allFrozen()) << "pass " << pass;
  }
  batch.applyPass(Ids{1, 2, 3}, Ids{1, 2, 3}, sure, renoise.draw());
  EXPECT_TRUE(batch.allFrozen());
  EXPECT_EQ(batch.passes(0), 3);
  // A new canvas starts from a history of -1 again.
  batch.startCanvas({1}, Ids{0, 0, 0});
  EXPECT_EQ(batch.passes(0), 0);
  batch.applyPass(Ids{1, 2, 3}, Ids{1, 2, 3}, sure, renoise.draw());
  EXPECT_FALSE(batch.allFrozen());
}

TEST(DenoisingBatch, ThresholdZeroStopsAtTheFirstConfidentPass) {
  DenoisingBatch batch(settings(0), 1);
  Renoise renoise;
  batch.startCanvas({1}, Ids{0, 0, 0});
  batch.applyPass(Ids{1, 2, 3}, Ids{1, 2, 3}, std::vector<float>{2.0f, 2.0f, 2.0f}, renoise.draw());
  EXPECT_FALSE(batch.allFrozen());  // stable, not confident
  batch.applyPass(Ids{1, 2, 3}, Ids{4, 5, 6}, std::vector<float>{0.0f, 0.0f, 0.0f}, renoise.draw());
  EXPECT_TRUE(batch.allFrozen());
  EXPECT_EQ(batch.argmaxCanvas(), (Ids{4, 5, 6}));
}

TEST(DenoisingBatch, RowsThatTakeNoPartAreFrozenFromTheStart) {
  DenoisingBatch batch(settings(), 2);
  Renoise renoise;
  batch.startCanvas({0, 1}, Ids{0, 0, 0, 31, 32, 33});
  EXPECT_EQ(batch.frozen(), (Mask{1, 0}));
  const Mask accepted = batch.applyPass(Ids{1, 2, 3, 4, 5, 6}, Ids{1, 2, 3, 4, 5, 6},
                                        std::vector<float>{0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, renoise.draw());
  EXPECT_EQ(accepted, (Mask{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(batch.canvas(), (Ids{0, 0, 0, 4, 5, 6}));
  EXPECT_EQ(batch.passes(0), 0);
  EXPECT_EQ(renoise.calls, (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace dgemma
