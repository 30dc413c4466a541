// Fills a plan's parameters: from safetensors (HF checkpoint or dgemma export) or from the
// parameters' declared init distributions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/exec/Executor.h"

namespace dgemma {

// Reads the global tensor for a plan parameter name, or nullopt when the checkpoint lacks it.
using TensorSource = std::function<std::optional<HostTensor>(const std::string& parameterName)>;

// Loads every plan parameter through `read`, slicing this rank's shard box out of the global tensor
// and converting floating dtypes. Missing and mis-shaped tensors, and the `otherProblems` the caller
// found (unexpected tensors, ...), are all collected into one InputError naming `source`.
void loadWeights(Executor& executor, const std::string& source, const TensorSource& read,
                 std::vector<std::string> otherProblems = {});

// The same for the safetensors under `weightsPath` (a directory or one file), whose tensor names are
// the plan's parameter names; a tensor the plan does not use is a problem too.
void loadWeights(Executor& executor, const std::string& weightsPath);

// Draws every parameter from its "init" spec: {"kind": "normal", "std": s} (mean 0),
// {"kind": "ones"}, {"kind": "zeros"}. Values depend only on (seed, parameter name, global element
// index), so every rank layout draws the same global tensor.
void initializeWeights(Executor& executor, uint64_t seed);

}  // namespace dgemma
