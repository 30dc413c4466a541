// The adapter of DiffusionGemma plans (docs/architecture.md, "The model boundary"): its names come
// from the model's spec (models/diffusion_gemma/spec/Interface.h), its checkpoints map onto the plan
// through the weight schema (docs/model.md), and its checkpoints are HF model directories
// (HfExport.h).
#pragma once

#include "runtime/model/ModelAdapter.h"

namespace dgemma {

const ModelAdapter& diffusionGemmaAdapter();

}  // namespace dgemma
