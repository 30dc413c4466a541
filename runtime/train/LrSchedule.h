// The learning-rate schedule (docs/training.md, "Learning-rate schedule"), in Megatron Core's
// conventions (megatron/core/optimizer_param_scheduler.py, OptimizerParamScheduler.get_lr):
//
//   lr(s) = init + (max − init) · s / warmup                                 s ≤ warmup (warmup > 0)
//   lr(s) = min + (max − min) · 0.5 · (cos(π · (s − warmup) / (decay − warmup)) + 1)   warmup < s ≤ decay
//   lr(s) = min                                                              s > decay
//
// (the linear style uses 1 − ratio for the cosine factor; the constant style is max after warmup).
//
// Step numbering. `s` counts *completed* optimizer steps, as Megatron's `num_steps` does: Megatron
// sets lr(0) when the scheduler is built and advances the scheduler after each successful
// optimizer.step(). So optimizer step n (1-based) applies lr(n − 1): with warmup the first step runs
// at lr(0) = init (0 by default), and lr(1) = max · 1/warmup is first applied by step 2. A skipped
// step (an overflow, a NaN gradient) does not advance the schedule. `at(s)` is the formula and
// `forOptimizerStep(n)` is at(n − 1); the trainer uses the latter and logs the value it applied.
// (Megatron counts in samples, num_steps = iterations · global batch; with a fixed global batch both
// ratios are the same real number and round to the same double, so iterations give the same bits.)
//
// The arithmetic follows Megatron's order of operations term by term, so every value is bit-equal
// to the Python one on the same libm.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

namespace dgemma {

enum class LrDecayStyle { Constant, Linear, Cosine };

// "constant" | "linear" | "cosine"; parse throws InputError naming the accepted values.
std::string lrDecayStyleName(LrDecayStyle style);
LrDecayStyle parseLrDecayStyle(const std::string& name);

struct LrScheduleConfig {
  double maxLr = 0.0;       // Megatron --lr
  double minLr = 0.0;       // --min-lr
  double initLr = 0.0;      // --lr-warmup-init: where warmup starts
  int64_t warmupSteps = 0;  // --lr-warmup-iters
  int64_t decaySteps = 1;   // --lr-decay-iters (usually the run's step count)
  LrDecayStyle style = LrDecayStyle::Cosine;
};

class LrSchedule {
 public:
  // Throws InputError "lr schedule: FIELD: ..." for a negative or non-finite rate, min > max,
  // init > max, a negative warmup, decay_steps < 1, or (linear, cosine) warmup ≥ decay_steps —
  // Megatron's assertions.
  explicit LrSchedule(const LrScheduleConfig& config);

  // The formula at `completedSteps` ≥ 0 optimizer steps (throws std::invalid_argument if negative).
  double at(int64_t completedSteps) const;
  // The rate optimizer step `step` (≥ 1) applies: at(step − 1).
  double forOptimizerStep(int64_t step) const;

  const LrScheduleConfig& config() const { return config_; }

  // {"style", "max_lr", "min_lr", "init_lr", "warmup_steps", "decay_steps"}: stored in a checkpoint's
  // config and compared on resume. fromJson validates as the constructor does and throws InputError
  // naming `what` and the field.
  nlohmann::json toJson() const;
  static LrSchedule fromJson(const nlohmann::json& json, const std::string& what);

 private:
  LrScheduleConfig config_;
};

}  // namespace dgemma
