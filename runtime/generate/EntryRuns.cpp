#include "runtime/generate/EntryRuns.h"

#include <algorithm>

#include "runtime/data/dataset/Dataset.h"
#include "support/Error.h"

namespace dgemma {

HostTensor i64Tensor(std::vector<int64_t> shape, const std::vector<int64_t>& values) {
  HostTensor tensor(DType::I64, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<int64_t>());
  return tensor;
}

HostTensor f32Tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  HostTensor tensor(DType::F32, std::move(shape));
  std::copy(values.begin(), values.end(), tensor.as<float>());
  return tensor;
}

std::map<std::string, HostTensor> runEntryPoint(Session& session, const EntryPoint& entry,
                                                std::map<std::string, HostTensor> inputs) {
  std::map<std::string, HostTensor> fed;
  for (const NamedBuffer& input : entry.inputs) {
    auto it = inputs.find(input.name);
    if (it == inputs.end())
      throw InputError(session.planPath + ": entry " + entry.key() + " takes input \"" + input.name +
                       "\", which generation does not provide (docs/inference-plan.md)");
    fed[input.name] = convertDType(std::move(it->second), session.plan.buffers[input.buffer].dtype,
                                   "input " + input.name + " of " + entry.key());
  }
  return session.executor->run(entry, fed);
}

HostTensor entryOutput(const std::map<std::string, HostTensor>& outputs, const std::string& name, DType dtype,
                       int64_t elements, const EntryPoint& entry, const std::string& planPath) {
  auto it = outputs.find(name);
  if (it == outputs.end()) throw InputError(planPath + ": entry " + entry.key() + " has no output \"" + name + "\"");
  HostTensor converted = convertDType(it->second, dtype, name);
  if (converted.numElements() != elements)
    throw InputError(planPath + ": entry " + entry.key() + ": expected " + std::to_string(elements) +
                     " values of output \"" + name + "\", got " + std::to_string(converted.numElements()));
  return converted;
}

const EntryPoint& entryNamed(const Plan& plan, const std::string& name, const std::string& planPath) {
  for (const EntryPoint& entry : plan.entryPoints)
    if (entry.name == name) return entry;
  throw InputError(planPath + ": no \"" + name + "\" entry point (compile the plan with dgemma-compile --mode infer)");
}

bool takesInput(const EntryPoint& entry, const std::string& name) {
  return std::any_of(entry.inputs.begin(), entry.inputs.end(),
                     [&](const NamedBuffer& input) { return input.name == name; });
}

}  // namespace dgemma
