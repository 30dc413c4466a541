#include "runtime/generate/Temperature.h"

namespace dgemma {

float scheduledTemperature(double tMin, double tMax, int64_t remaining, int64_t maxSteps) {
  const float ratio = static_cast<float>(remaining) / static_cast<float>(maxSteps);
  const float width = static_cast<float>(tMax - tMin);
  return static_cast<float>(tMin) + width * ratio;
}

}  // namespace dgemma
