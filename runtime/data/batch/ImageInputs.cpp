#include "runtime/data/batch/ImageInputs.h"

#include <algorithm>
#include <vector>

#include "support/Error.h"
#include "support/Shape.h"

namespace dgemma {

ImagePlanInputs deriveImagePlanInputs(const HostTensor& imagePositionIds, const HostTensor& mmTokenTypeIds,
                                      int64_t imagesPerExample, int64_t poolingKernel, int64_t maxSoftTokens) {
  if (imagePositionIds.dtype != DType::I64 || imagePositionIds.shape.size() != 3 || imagePositionIds.shape[2] != 2)
    throw InputError("image_position_ids: expected i64 [N, N_p, 2], got " + shapeToString(imagePositionIds.shape));
  if (mmTokenTypeIds.shape.size() != 2)
    throw InputError("mm_token_type_ids: expected [B, P], got " + shapeToString(mmTokenTypeIds.shape));
  if (imagesPerExample < 1 || poolingKernel < 1 || maxSoftTokens < 1)
    throw InputError("image inputs: expected images_per_example, pooling kernel and max soft tokens >= 1");
  const HostTensor types = convertDType(mmTokenTypeIds, DType::I64, "mm_token_type_ids");
  const int64_t N = imagePositionIds.shape[0], patches = imagePositionIds.shape[1];
  const int64_t B = types.shape[0], P = types.shape[1], T = maxSoftTokens, k = poolingKernel;
  if (N != B * imagesPerExample)
    throw InputError("image_position_ids: " + std::to_string(N) + " images for " + std::to_string(B) + " examples of " +
                     std::to_string(imagesPerExample) + " images each");
  const int64_t outOfRange = N * T;
  ImagePlanInputs result{HostTensor(DType::I64, {N, patches}), HostTensor(DType::I64, {B, P}), HostTensor(DType::I64, {B, P})};
  std::vector<int64_t> pooled(N, 0);  // m per image
  const int64_t* positions = imagePositionIds.as<int64_t>();
  for (int64_t n = 0; n < N; ++n) {
    const int64_t* image = positions + n * patches * 2;
    auto valid = [&](int64_t p) { return !(image[2 * p] == -1 && image[2 * p + 1] == -1); };
    int64_t maxX = 0;
    for (int64_t p = 0; p < patches; ++p)
      if (valid(p)) maxX = std::max(maxX, image[2 * p] + 1);
    std::vector<int64_t> buckets(patches, -1), occupied;
    for (int64_t p = 0; p < patches; ++p)
      if (valid(p)) {
        buckets[p] = image[2 * p] / k + (maxX / k) * (image[2 * p + 1] / k);
        occupied.push_back(buckets[p]);
      }
    std::sort(occupied.begin(), occupied.end());
    occupied.erase(std::unique(occupied.begin(), occupied.end()), occupied.end());
    pooled[n] = static_cast<int64_t>(occupied.size());
    if (pooled[n] > T)
      throw InputError("image " + std::to_string(n) + ": " + std::to_string(pooled[n]) + " pooled tokens, more than the " +
                       std::to_string(T) + " soft tokens per image");
    int64_t* slots = result.poolSlot.as<int64_t>() + n * patches;
    for (int64_t p = 0; p < patches; ++p)
      slots[p] = buckets[p] < 0 ? outOfRange
                                : n * T + (std::lower_bound(occupied.begin(), occupied.end(), buckets[p]) - occupied.begin());
  }
  const int64_t* type = types.as<int64_t>();
  int64_t* tokenIndex = result.tokenIndex.as<int64_t>();
  int64_t* segments = result.segmentIds.as<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    std::vector<int64_t> rows;  // the example's pooled features, image after image
    for (int64_t i = 0; i < imagesPerExample; ++i) {
      const int64_t n = b * imagesPerExample + i;
      for (int64_t r = 0; r < pooled[n]; ++r) rows.push_back(n * T + r);
    }
    int64_t tokens = 0, run = 0;
    for (int64_t p = 0; p < P; ++p) {
      const bool isImage = type[b * P + p] == 1;
      if (isImage && (p == 0 || type[b * P + p - 1] != 1)) ++run;
      segments[b * P + p] = isImage ? run : 0;
      tokenIndex[b * P + p] = isImage && tokens < static_cast<int64_t>(rows.size()) ? rows[tokens] : outOfRange;
      tokens += isImage;
    }
    if (tokens != static_cast<int64_t>(rows.size()))
      throw InputError("example " + std::to_string(b) + ": " + std::to_string(tokens) + " image tokens but the images give " +
                       std::to_string(rows.size()) + " pooled tokens");
  }
  return result;
}

}  // namespace dgemma
