// Fills a plan's parameters: from safetensors (HF checkpoint or dgemma export) or from the
// parameters' declared init distributions.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/exec/Executor.h"
#include "runtime/io/Safetensors.h"

namespace dgemma {

// Reads the global tensor for a plan parameter name, or nullopt when the checkpoint lacks it.
using TensorSource = std::function<std::optional<HostTensor>(const std::string& parameterName)>;

// Loads every plan parameter through `read`, slicing this rank's shard box out of the global tensor
// and converting floating dtypes. Missing and mis-shaped tensors, and the `otherProblems` the caller
// found (unexpected tensors, ...), are all collected into one InputError naming `source`.
void loadWeights(Executor& executor, const std::string& source, const TensorSource& read,
                 std::vector<std::string> otherProblems = {});

// Where a plan parameter's global tensor lies in a memory-mapped checkpoint, or nullopt when the
// checkpoint lacks it.
using TensorLocator = std::function<std::optional<SafetensorsLocation>(const std::string& parameterName)>;

// Loads every plan parameter by copying this rank's box straight out of the mapping (the global
// tensor is never materialised) and converting it to the plan's dtype; the mapping's pages are then
// dropped from the resident set (SafetensorsFile::release). Extra memory: one box in the plan's
// dtype at a time (plus its stored-dtype copy when the rank holds part of the tensor). Every missing, mis-shaped or unconvertible tensor (named
// with its file) and the caller's `otherProblems` are checked first and reported together in one
// InputError naming `source`, before anything is copied. A progress line goes to stderr on rank 0
// when it is a terminal.
// Parameters `filledElsewhere` accepts (an adapter plan's LoRA adapters, which no base checkpoint
// holds) are neither looked up nor touched.
void loadMappedWeights(Executor& executor, const std::string& source, const TensorLocator& locate,
                       std::vector<std::string> otherProblems = {},
                       const std::function<bool(const Parameter&)>& filledElsewhere = {});

// The same for the safetensors under `weightsPath` (a directory or one file), whose tensor names are
// the plan's parameter names; a tensor the plan does not use is a problem too.
void loadWeights(Executor& executor, const std::string& weightsPath);

// Draws every parameter from its "init" spec: {"kind": "normal", "std": s} (mean 0),
// {"kind": "uniform", "bound": b} (U(-b, b)), {"kind": "ones"}, {"kind": "zeros"}. Values depend
// only on (seed, parameter name, global element index), so every rank layout draws the same global
// tensor.
void initializeWeights(Executor& executor, uint64_t seed);
// The same for the parameters `which` accepts only (the LoRA adapters of a plan whose base comes
// from a checkpoint); the others are left as they are.
void initializeWeights(Executor& executor, uint64_t seed, const std::function<bool(const Parameter&)>& which);

}  // namespace dgemma
