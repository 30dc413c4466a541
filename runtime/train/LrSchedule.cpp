#include "runtime/train/LrSchedule.h"

#include <cmath>
#include <numbers>
#include <stdexcept>

#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

[[noreturn]] void reject(const std::string& what, const std::string& field, const std::string& message) {
  throw InputError(what + ": " + field + ": " + message);
}

void validate(const LrScheduleConfig& c, const std::string& what) {
  auto rate = [&](double value, const char* field) {
    if (!std::isfinite(value) || value < 0.0) reject(what, field, "expected a finite rate >= 0, got " + std::to_string(value));
  };
  rate(c.maxLr, "max_lr");
  rate(c.minLr, "min_lr");
  rate(c.initLr, "init_lr");
  if (c.minLr > c.maxLr) reject(what, "min_lr", "must not exceed max_lr");
  if (c.initLr > c.maxLr) reject(what, "init_lr", "must not exceed max_lr");
  if (c.warmupSteps < 0) reject(what, "warmup_steps", "expected >= 0, got " + std::to_string(c.warmupSteps));
  if (c.decaySteps < 1) reject(what, "decay_steps", "expected >= 1, got " + std::to_string(c.decaySteps));
  if (c.style != LrDecayStyle::Constant && c.warmupSteps >= c.decaySteps)
    reject(what, "warmup_steps",
           std::to_string(c.warmupSteps) + " must be below decay_steps (" + std::to_string(c.decaySteps) + ")");
}

}  // namespace

std::string lrDecayStyleName(LrDecayStyle style) {
  switch (style) {
    case LrDecayStyle::Constant: return "constant";
    case LrDecayStyle::Linear: return "linear";
    case LrDecayStyle::Cosine: return "cosine";
  }
  return "?";
}

LrDecayStyle parseLrDecayStyle(const std::string& name) {
  if (name == "constant") return LrDecayStyle::Constant;
  if (name == "linear") return LrDecayStyle::Linear;
  if (name == "cosine") return LrDecayStyle::Cosine;
  throw InputError("lr schedule: style: expected constant, linear or cosine, got '" + name + "'");
}

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) { validate(config_, "lr schedule"); }

double LrSchedule::at(int64_t completedSteps) const {
  if (completedSteps < 0) throw std::invalid_argument("LrSchedule::at: negative step " + std::to_string(completedSteps));
  const LrScheduleConfig& c = config_;
  // Each expression keeps Megatron's operand order; ((max − init) · s) / warmup is not max · (s / warmup).
  if (c.warmupSteps > 0 && completedSteps <= c.warmupSteps)
    return c.initLr + (c.maxLr - c.initLr) * static_cast<double>(completedSteps) / static_cast<double>(c.warmupSteps);
  if (c.style == LrDecayStyle::Constant) return c.maxLr;
  if (completedSteps > c.decaySteps) return c.minLr;
  double ratio = static_cast<double>(completedSteps - c.warmupSteps) / static_cast<double>(c.decaySteps - c.warmupSteps);
  double coefficient = c.style == LrDecayStyle::Linear ? 1.0 - ratio : 0.5 * (std::cos(std::numbers::pi * ratio) + 1.0);
  return c.minLr + coefficient * (c.maxLr - c.minLr);
}

double LrSchedule::forOptimizerStep(int64_t step) const {
  if (step < 1) throw std::invalid_argument("LrSchedule::forOptimizerStep: steps count from 1, got " + std::to_string(step));
  return at(step - 1);
}

nlohmann::json LrSchedule::toJson() const {
  return {{"style", lrDecayStyleName(config_.style)}, {"max_lr", config_.maxLr},           {"min_lr", config_.minLr},
          {"init_lr", config_.initLr},                {"warmup_steps", config_.warmupSteps}, {"decay_steps", config_.decaySteps}};
}

LrSchedule LrSchedule::fromJson(const nlohmann::json& json, const std::string& what) {
  if (!json.is_object()) throw InputError(what + ": expected an object");
  auto field = [&](const char* name) -> const nlohmann::json& {
    auto found = json.find(name);
    if (found == json.end()) reject(what, name, "missing");
    return *found;
  };
  auto number = [&](const char* name) {
    const nlohmann::json& value = field(name);
    if (!value.is_number()) reject(what, name, "expected a number");
    return value.get<double>();
  };
  auto integer = [&](const char* name) {
    const nlohmann::json& value = field(name);
    if (!value.is_number_integer()) reject(what, name, "expected an integer");
    return value.get<int64_t>();
  };
  const nlohmann::json& style = field("style");
  if (!style.is_string()) reject(what, "style", "expected a string");
  LrScheduleConfig config;
  try {
    config.style = parseLrDecayStyle(style.get<std::string>());
  } catch (const InputError&) {
    reject(what, "style", "expected constant, linear or cosine, got " + quoteForMessage(style.get<std::string>()));
  }
  config.maxLr = number("max_lr");
  config.minLr = number("min_lr");
  config.initLr = number("init_lr");
  config.warmupSteps = integer("warmup_steps");
  config.decaySteps = integer("decay_steps");
  validate(config, what);
  return LrSchedule(config);
}

}  // namespace dgemma
