#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "runtime/train/LrSchedule.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::expectInputError;
using test::mentions;

// The 26B recipe (docs/training.md, "The 26B recipe"): 5e-5 → 5e-6 cosine, warmup 20, decay 1000.
LrSchedule recipe() { return LrSchedule({.maxLr = 5e-5, .minLr = 5e-6, .warmupSteps = 20, .decaySteps = 1000}); }

TEST(LrScheduleTest, WarmupIsLinearFromZero) {
  LrSchedule schedule = recipe();
  EXPECT_EQ(schedule.at(0), 0.0);
  EXPECT_DOUBLE_EQ(schedule.at(1), 2.5e-6);    // 5e-5 · 1/20
  EXPECT_DOUBLE_EQ(schedule.at(10), 2.5e-5);   // half way
  EXPECT_DOUBLE_EQ(schedule.at(19), 4.75e-5);
  EXPECT_DOUBLE_EQ(schedule.at(20), 5e-5);     // the peak is reached at s = warmup
}

TEST(LrScheduleTest, CosineDecayToMinimumThenConstant) {
  LrSchedule schedule = recipe();
  // s = 510 is half way through the decay (490 of 980): cos(π/2) = 0, lr = min + (max − min)/2.
  EXPECT_DOUBLE_EQ(schedule.at(510), 2.75e-5);
  // One step into the decay: min + (max − min) · (1 + cos(π/980)) / 2 ≈ max − (max − min) · (π/980)²/4.
  double expected = 5e-5 - 4.5e-5 * (M_PI / 980) * (M_PI / 980) / 4;
  EXPECT_NEAR(schedule.at(21), expected, 1e-16);
  EXPECT_DOUBLE_EQ(schedule.at(1000), 5e-6);
  EXPECT_DOUBLE_EQ(schedule.at(1001), 5e-6);
  EXPECT_DOUBLE_EQ(schedule.at(100000), 5e-6);
  for (int64_t s = 21; s < 1000; ++s) EXPECT_LT(schedule.at(s), schedule.at(s - 1)) << "s = " << s;
}

// Bit-exact against Megatron Core's OptimizerParamScheduler.get_lr evaluated in Python 3 (the same
// libm cos), printed with %.17g. at(3) pins Megatron's order of operations: ((max − init) · s) / warmup
// is 7.500000000000001e-06, while max · (s / warmup) would be 7.5000000000000002e-06.
TEST(LrScheduleTest, BitEqualToMegatron) {
  LrSchedule schedule = recipe();
  EXPECT_EQ(schedule.at(3), 7.500000000000001e-06);
  EXPECT_EQ(schedule.at(7), 1.7499999999999998e-05);
  EXPECT_EQ(schedule.at(21), 4.9999884388843795e-05);
  EXPECT_EQ(schedule.at(100), 4.9264134418378163e-05);
  EXPECT_EQ(schedule.at(999), 5.0001156111562113e-06);
  // AM's alternative recipe: 1.5e-4 → 1.5e-5, warmup 25, 800 steps.
  LrSchedule am({.maxLr = 1.5e-4, .minLr = 1.5e-5, .warmupSteps = 25, .decaySteps = 800});
  EXPECT_EQ(am.at(400), 8.591881889661309e-05);
}

// Megatron advances the scheduler after optimizer.step(): step n applies lr(n − 1).
TEST(LrScheduleTest, OptimizerStepNumbering) {
  LrSchedule schedule = recipe();
  EXPECT_EQ(schedule.forOptimizerStep(1), 0.0);
  EXPECT_EQ(schedule.forOptimizerStep(2), schedule.at(1));
  EXPECT_EQ(schedule.forOptimizerStep(21), 5e-5);
  EXPECT_EQ(schedule.forOptimizerStep(1001), 5e-6);
  EXPECT_THROW(schedule.forOptimizerStep(0), std::invalid_argument);
  EXPECT_THROW(schedule.at(-1), std::invalid_argument);
}

TEST(LrScheduleTest, LinearAndConstantStyles) {
  LrSchedule linear({.maxLr = 5e-5, .minLr = 5e-6, .warmupSteps = 20, .decaySteps = 1000, .style = LrDecayStyle::Linear});
  EXPECT_DOUBLE_EQ(linear.at(510), 2.75e-5);
  EXPECT_DOUBLE_EQ(linear.at(21), 5e-6 + 4.5e-5 * (979.0 / 980.0));
  EXPECT_DOUBLE_EQ(linear.at(1000), 5e-6);

  // The planned multi-rank resume test (docs/parallelism.md, "Sharded checkpoints and resume") runs a
  // constant 1e-4 with no warmup.
  LrSchedule constant({.maxLr = 1e-4, .warmupSteps = 0, .decaySteps = 1, .style = LrDecayStyle::Constant});
  EXPECT_EQ(constant.at(0), 1e-4);
  EXPECT_EQ(constant.forOptimizerStep(1), 1e-4);
  EXPECT_EQ(constant.at(5000), 1e-4);

  // No warmup: the decay starts at max at s = 0.
  LrSchedule noWarmup({.maxLr = 1e-3, .minLr = 0.0, .warmupSteps = 0, .decaySteps = 10});
  EXPECT_EQ(noWarmup.at(0), 1e-3);
  EXPECT_DOUBLE_EQ(noWarmup.at(5), 5e-4);
  EXPECT_EQ(noWarmup.at(10), 0.0);
}

TEST(LrScheduleTest, WarmupFromANonZeroInitialRate) {
  LrSchedule schedule({.maxLr = 1e-3, .minLr = 1e-4, .initLr = 1e-4, .warmupSteps = 10, .decaySteps = 100});
  EXPECT_EQ(schedule.at(0), 1e-4);
  EXPECT_DOUBLE_EQ(schedule.at(5), 5.5e-4);
  EXPECT_DOUBLE_EQ(schedule.at(10), 1e-3);
}

TEST(LrScheduleTest, RejectsWhatMegatronAsserts) {
  EXPECT_TRUE(mentions(expectInputError([] { LrSchedule({.maxLr = 1e-4, .warmupSteps = 10, .decaySteps = 10}); }),
                       "warmup_steps: 10 must be below decay_steps (10)"));
  EXPECT_TRUE(mentions(expectInputError([] { LrSchedule({.maxLr = 1e-4, .minLr = 1e-3, .decaySteps = 10}); }),
                       "min_lr: must not exceed max_lr"));
  EXPECT_TRUE(mentions(expectInputError([] { LrSchedule({.maxLr = -1.0, .decaySteps = 10}); }), "max_lr"));
  EXPECT_TRUE(mentions(expectInputError([] { LrSchedule({.maxLr = NAN, .decaySteps = 10}); }), "max_lr"));
  EXPECT_TRUE(mentions(expectInputError([] { LrSchedule({.maxLr = 1e-4, .decaySteps = 0}); }), "decay_steps"));
  EXPECT_TRUE(mentions(expectInputError([] { LrSchedule({.maxLr = 1e-4, .warmupSteps = -1, .decaySteps = 5}); }),
                       "warmup_steps"));
  EXPECT_TRUE(mentions(expectInputError([] { parseLrDecayStyle("exp"); }), "expected constant, linear or cosine"));
}

TEST(LrScheduleTest, JsonRoundTrip) {
  LrSchedule schedule = recipe();
  nlohmann::json json = schedule.toJson();
  EXPECT_EQ(json["style"], "cosine");
  EXPECT_EQ(json["warmup_steps"], 20);
  // nlohmann writes doubles with enough digits to read them back exactly.
  LrSchedule back = LrSchedule::fromJson(nlohmann::json::parse(json.dump()), "ckpt/manifest.json: config.lr_schedule");
  for (int64_t s : {0, 1, 20, 21, 500, 1000, 1001}) EXPECT_EQ(back.at(s), schedule.at(s));

  json["style"] = "step";
  EXPECT_TRUE(mentions(expectInputError([&] { LrSchedule::fromJson(json, "ckpt/manifest.json: config.lr_schedule"); }),
                       "ckpt/manifest.json: config.lr_schedule: style"));
  json["style"] = "cosine";
  json.erase("decay_steps");
  EXPECT_TRUE(mentions(expectInputError([&] { LrSchedule::fromJson(json, "sched"); }), "sched: decay_steps: missing"));
}

}  // namespace
}  // namespace dgemma
