// Running a generation entry point from the host (docs/inference-plan.md): host tensors of the
// inputs, the run with each input converted to its buffer's dtype, and the outputs by name.
// Shared by the batch Generator and the serving engine.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/core/HostTensor.h"
#include "runtime/session/Session.h"

namespace dgemma {

HostTensor i64Tensor(std::vector<int64_t> shape, const std::vector<int64_t>& values);
HostTensor f32Tensor(std::vector<int64_t> shape, const std::vector<float>& values);

// Runs `entry` on the inputs it takes, each converted to the dtype of its buffer; InputError naming
// an input the entry takes and `inputs` lacks. Inputs the entry does not take are ignored.
std::map<std::string, HostTensor> runEntryPoint(Session& session, const EntryPoint& entry,
                                                std::map<std::string, HostTensor> inputs);

// Output `name` of `entry`'s run, converted to `dtype` with `elements` values; InputError naming the
// plan when it is missing or has another size.
HostTensor entryOutput(const std::map<std::string, HostTensor>& outputs, const std::string& name, DType dtype,
                       int64_t elements, const EntryPoint& entry, const std::string& planPath);

// The plan's first entry point named `name`; InputError naming the plan when it has none (an
// inference plan has every generation entry: dgemma-compile --mode infer).
const EntryPoint& entryNamed(const Plan& plan, const std::string& name, const std::string& planPath);

// Whether `entry` takes input `name`.
bool takesInput(const EntryPoint& entry, const std::string& name);

}  // namespace dgemma
