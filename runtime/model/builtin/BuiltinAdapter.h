// The adapter of the built-in test graph (models/builtin: RMSNorm, matmul, softmax), whose
// parameters are loaded by name and which has no tokenizer, images or HF directory.
#pragma once

#include "runtime/model/ModelAdapter.h"

namespace dgemma {

const ModelAdapter& builtinAdapter();

}  // namespace dgemma
