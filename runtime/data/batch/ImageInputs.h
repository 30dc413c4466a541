// The host-derived inputs of an image entry (CONTRACT of the image twins; docs/data.md, "Collated
// batch"): where each patch is pooled, which pooled feature replaces each image soft token of the
// prompt, and the runs of image tokens the encoder sees bidirectionally.
#pragma once

#include <cstdint>

#include "runtime/core/HostTensor.h"

namespace dgemma {

struct ImagePlanInputs {
  HostTensor poolSlot;    // image_pool_slot [N, N_p] i64
  HostTensor tokenIndex;  // image_token_index [B, P] i64
  HostTensor segmentIds;  // image_segment_ids [B, P] i64
};

// imagePositionIds [N, N_p, 2] i64 ((x, y) per patch, (-1, -1) on padding), mmTokenTypeIds [B, P]
// (i64 or i32, 1 on image soft tokens), N = B·imagesPerExample. Throws InputError when an image has
// more than maxSoftTokens pooled tokens, or an example's image soft tokens differ in number from
// its images' pooled tokens ("example b: X image tokens but the images give Y pooled tokens").
ImagePlanInputs deriveImagePlanInputs(const HostTensor& imagePositionIds, const HostTensor& mmTokenTypeIds,
                                      int64_t imagesPerExample, int64_t poolingKernel, int64_t maxSoftTokens);

}  // namespace dgemma
