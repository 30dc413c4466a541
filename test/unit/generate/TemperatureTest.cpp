#include <gtest/gtest.h>

#include <cmath>

#include "runtime/generate/Temperature.h"

namespace dgemma {
namespace {

// Values computed by torch: t_min + (t_max - t_min) * (torch.tensor(n, dtype=torch.int32) / N).
TEST(Temperature, FirstPassIsTMaxAndTheLastStaysAboveTMin) {
  EXPECT_EQ(scheduledTemperature(0.4, 0.8, 48, 48), std::ldexp(0x1.99999ap0f, -1));  // 0.8f
  EXPECT_EQ(scheduledTemperature(0.4, 0.8, 1, 48), std::ldexp(0x1.a22222p0f, -2));   // 0.408333...
  EXPECT_EQ(scheduledTemperature(0.4, 0.8, 17, 48), std::ldexp(0x1.155556p0f, -1));
  EXPECT_GT(scheduledTemperature(0.4, 0.8, 1, 48), 0.4f);
}

TEST(Temperature, RoundsInF32AsTorchDoes) {
  // Here the f32 arithmetic and the double formula rounded once differ by one ulp; torch gives the
  // f32 one.
  EXPECT_EQ(scheduledTemperature(0.3, 0.9, 5, 11), std::ldexp(0x1.253c84p0f, -1));
  EXPECT_NE(scheduledTemperature(0.3, 0.9, 5, 11), static_cast<float>(0.3 + (0.9 - 0.3) * (5.0 / 11.0)));
  EXPECT_EQ(scheduledTemperature(0.1, 0.7, 3, 7), std::ldexp(0x1.6db6dcp0f, -2));
}

}  // namespace
}  // namespace dgemma
