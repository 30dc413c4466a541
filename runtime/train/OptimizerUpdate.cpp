#include "runtime/train/OptimizerUpdate.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "support/Error.h"

namespace dgemma {

namespace {

// A scalar input of `entry` in the dtype and shape the plan declares.
HostTensor scalarInput(const Plan& plan, const EntryPoint& entry, const std::string& name, double value) {
  for (const NamedBuffer& input : entry.inputs) {
    if (input.name != name) continue;
    const Buffer& buffer = plan.buffers[input.buffer];
    HostTensor wide(DType::F64, buffer.shape);
    std::fill(wide.as<double>(), wide.as<double>() + wide.numElements(), value);
    return convertDType(wide, buffer.dtype, name);
  }
  throw InputError("entry " + entry.key() + ": no input " + name);
}

}  // namespace

float applyOptimizerUpdate(Session& session, const TrainPlan& trainPlan, int64_t appliedUpdates, double lr,
                           double gradientScale) {
  const Plan& plan = session.plan;
  const EntryPoint& entry = plan.entryPoints[trainPlan.optimizerStep];
  const double n = static_cast<double>(appliedUpdates);
  std::map<std::string, HostTensor> inputs = {
      {"lr", scalarInput(plan, entry, "lr", lr)},
      {"bias_correction1", scalarInput(plan, entry, "bias_correction1", 1.0 - std::pow(trainPlan.optimizer.beta1, n))},
      {"bias_correction2", scalarInput(plan, entry, "bias_correction2", 1.0 - std::pow(trainPlan.optimizer.beta2, n))},
      {"gradient_scale", scalarInput(plan, entry, "gradient_scale", gradientScale)}};
  const std::map<std::string, HostTensor> outputs = session.executor->run(entry, inputs);
  auto it = outputs.find("grad_norm");
  if (it == outputs.end() || it->second.numElements() != 1)
    throw InputError("entry " + entry.key() + ": expected a scalar output grad_norm");
  return convertDType(it->second, DType::F32, "grad_norm").as<float>()[0];
}

}  // namespace dgemma
