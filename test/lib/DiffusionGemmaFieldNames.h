// The data pipeline's field names as DiffusionGemma's adapter gives them
// (runtime/model/diffusion_gemma), for tests that collate batches without a plan.
#pragma once

#include "models/diffusion_gemma/spec/Interface.h"
#include "runtime/data/batch/Blocks.h"
#include "runtime/data/batch/ImageInputs.h"

namespace dgemma::testing {

inline CollatedFieldNames diffusionGemmaBatchNames() {
  namespace names = diffusion_gemma;
  return {names::kInputIds,     names::kAttentionMask, names::kPositionIds,
          names::kTokenTypeIds, names::kCanvasIds,     names::kCanvasMask};
}

inline ImageFieldNames diffusionGemmaImageNames() {
  namespace names = diffusion_gemma;
  return {names::kPixelValues,   names::kImagePositionIds, names::kTokenTypeIds,
          names::kImagePoolSlot, names::kImageTokenIndex,  names::kImageSegmentIds};
}

}  // namespace dgemma::testing
