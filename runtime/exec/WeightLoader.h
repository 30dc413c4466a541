// Fills a plan's parameters: from safetensors (HF checkpoint or dgemma export) or from the
// parameters' declared init distributions.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/exec/Executor.h"

namespace dgemma {

// Loads every plan parameter from the safetensors under `weightsPath` (a directory or one file),
// slicing this rank's shard box out of the global tensor and converting floating dtypes. Missing,
// unexpected and mis-shaped tensors are all collected into one InputError.
void loadWeights(Executor& executor, const std::string& weightsPath);

// Draws every parameter from its "init" spec: {"kind": "normal", "std": s} (mean 0),
// {"kind": "ones"}, {"kind": "zeros"}. Values depend only on (seed, parameter name, global element
// index), so every rank layout draws the same global tensor.
void initializeWeights(Executor& executor, uint64_t seed);

}  // namespace dgemma
