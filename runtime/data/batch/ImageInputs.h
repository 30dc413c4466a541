// The host-derived inputs of an image plan (docs/model.md, "Image entries"): from the processor's
// patch positions and the prompt's mm_token_type_ids, where each patch is pooled to, which pooled
// token replaces each image soft token of the prompt, and the runs of image tokens the encoder's
// image-bidirectional overlay groups. The runtime and the parity tests derive them with this one
// function, so the plan never has to compute a data-dependent index.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/core/HostTensor.h"

namespace dgemma {

// The names of an image batch's fields: the model's (its adapter's ModelContract,
// runtime/model/ModelAdapter.h).
struct ImageFieldNames {
  std::string pixelValues, imagePositionIds;                   // collateImages()'s (runtime/data/dataset/Dataset.h)
  std::string tokenTypeIds;                                    // collate()'s, read
  std::string imagePoolSlot, imageTokenIndex, imageSegmentIds;  // addImagePlanInputs()'s
};

struct ImagePlanInputs {
  HostTensor poolSlot;    // image_pool_slot [N, N_p] i64: n·T + rank of the patch's bucket; N·T on padding
  HostTensor tokenIndex;  // image_token_index [B, P] i64: row of the pooled list [N·T] per soft token; N·T elsewhere
  HostTensor segmentIds;  // image_segment_ids [B, P] i64: r >= 1 on the r-th run of soft tokens; 0 elsewhere
};

// imagePositionIds [N, N_p, 2] i64 ((x, y) per patch, (-1, -1) on padding), mmTokenTypeIds [B, P]
// i64 or i32 (1 on image soft tokens), N = B·imagesPerExample (example b owns images
// [b·I, (b+1)·I)). Throws InputError for inconsistent shapes, an image with more than
// maxSoftTokens occupied pooling buckets, and an example whose image soft-token count differs from
// its images' pooled-token count ("example b: X image tokens but the images give Y pooled tokens").
ImagePlanInputs deriveImagePlanInputs(const HostTensor& imagePositionIds, const HostTensor& mmTokenTypeIds,
                                      int64_t imagesPerExample, int64_t poolingKernel, int64_t maxSoftTokens);

}  // namespace dgemma
