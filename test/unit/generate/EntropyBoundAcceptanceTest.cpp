#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "runtime/generate/EntropyBoundAcceptance.h"

namespace dgemma {
namespace {

using Mask = std::vector<uint8_t>;

TEST(EntropyBoundAcceptance, AcceptsTheLowEntropyPrefixWhoseSumBeforeEachStaysWithinTheBound) {
  // Sorted: 0.05 (1), 0.08 (2), 0.09 (4), 0.3 (3), 0.5 (0); sums before: 0, 0.05, 0.13, ...
  const std::vector<float> entropy = {0.5f, 0.05f, 0.08f, 0.3f, 0.09f};
  EXPECT_EQ(entropyBoundAccept(entropy, 0.1), (Mask{0, 1, 1, 0, 0}));
  // Sums before: 0, 0.01, 0.03, 0.06, 0.26: everything but the highest.
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{0.5f, 0.01f, 0.02f, 0.03f, 0.2f}, 0.1), (Mask{0, 1, 1, 1, 1}));
}

TEST(EntropyBoundAcceptance, TheLowestEntropyIsAlwaysAccepted) {
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{6.0f, 5.0f, 7.0f}, 0.1), (Mask{0, 1, 0}));
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{3.0f}, 1e-9), (Mask{1}));
}

TEST(EntropyBoundAcceptance, TiesKeepThePositionOrder) {
  // Sums before 0, 0.05, 0.1 in position order: the first two of three equal entropies.
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{0.05f, 0.05f, 0.05f}, 0.05), (Mask{1, 1, 0}));
  // Position 0 comes before position 2; its sum before is 0.05 + 0.05 = 0.1, but torch's
  // f32(0.05 + 0.05 + 0.2) - 0.2 rounds above 0.1f, so neither 0.2 is accepted (torch agrees).
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{0.2f, 0.05f, 0.2f, 0.05f}, 0.1), (Mask{0, 1, 0, 1}));
}

TEST(EntropyBoundAcceptance, TheSumBeforeIsTheInclusiveSumMinusTheOwnEntropyInF32) {
  // Cases found against torch.cumsum: the exclusive sum (the lower entropy alone) and torch's
  // cumsum - entropy disagree about the bound 0.1 (compared in f32).
  const float tenth = std::ldexp(0x1.99999ap0f, -4);  // 0.1f
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{std::ldexp(0x1.fcb894p0f, -1), tenth}, 0.1), (Mask{0, 1}));
  const float aboveTenth = std::ldexp(0x1.99999cp0f, -4);
  EXPECT_EQ(entropyBoundAccept(std::vector<float>{aboveTenth, std::ldexp(0x1.192e9ep0f, 1)}, 0.1), (Mask{1, 1}));
}

}  // namespace
}  // namespace dgemma
