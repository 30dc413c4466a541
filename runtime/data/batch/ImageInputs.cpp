#include "runtime/data/batch/ImageInputs.h"

#include <algorithm>
#include <string>
#include <vector>

#include "support/Error.h"

namespace dgemma {

namespace {

constexpr const char* kWhere = "image plan inputs";

[[noreturn]] void fail(const std::string& what) { throw InputError(std::string(kWhere) + ": " + what); }

std::vector<int64_t> tokenTypes(const HostTensor& mmTokenTypeIds) {
  std::vector<int64_t> types(mmTokenTypeIds.numElements());
  for (int64_t i = 0; i < mmTokenTypeIds.numElements(); ++i)
    types[i] = mmTokenTypeIds.dtype == DType::I32 ? mmTokenTypeIds.as<int32_t>()[i] : mmTokenTypeIds.as<int64_t>()[i];
  return types;
}

}  // namespace

ImagePlanInputs deriveImagePlanInputs(const HostTensor& imagePositionIds, const HostTensor& mmTokenTypeIds,
                                      int64_t imagesPerExample, int64_t poolingKernel, int64_t maxSoftTokens) {
  if (imagesPerExample < 1 || poolingKernel < 1 || maxSoftTokens < 1)
    fail("images per example, pooling kernel and soft tokens per image must be >= 1, got " +
         std::to_string(imagesPerExample) + ", " + std::to_string(poolingKernel) + ", " + std::to_string(maxSoftTokens));
  if (imagePositionIds.dtype != DType::I64 || imagePositionIds.shape.size() != 3 || imagePositionIds.shape[2] != 2)
    fail("image_position_ids: expected i64 [N, N_p, 2], got " + std::string(dtypeName(imagePositionIds.dtype)) + " " +
         shapeToString(imagePositionIds.shape));
  if ((mmTokenTypeIds.dtype != DType::I64 && mmTokenTypeIds.dtype != DType::I32) || mmTokenTypeIds.shape.size() != 2)
    fail("mm_token_type_ids: expected i64 or i32 [B, P], got " + std::string(dtypeName(mmTokenTypeIds.dtype)) + " " +
         shapeToString(mmTokenTypeIds.shape));
  const int64_t images = imagePositionIds.shape[0], patches = imagePositionIds.shape[1];
  const int64_t batch = mmTokenTypeIds.shape[0], promptLength = mmTokenTypeIds.shape[1];
  if (images != batch * imagesPerExample)
    fail("image_position_ids holds " + std::to_string(images) + " images, expected " + std::to_string(batch) +
         " examples x " + std::to_string(imagesPerExample) + " images per example");
  const int64_t pooledRows = images * maxSoftTokens;  // the out-of-range row: padding, text

  ImagePlanInputs result;
  result.poolSlot = HostTensor(DType::I64, {images, patches});
  result.tokenIndex = HostTensor(DType::I64, {batch, promptLength});
  result.segmentIds = HostTensor(DType::I64, {batch, promptLength});

  // Pooling (docs/model.md, "Vision tower and projector"): a valid patch falls into the k×k bucket
  // floor(x/k) + (max_x / k)·floor(y/k); the occupied buckets, in ascending order, are the image's
  // pooled tokens.
  std::vector<int64_t> pooledTokens(images, 0);
  const int64_t* positions = imagePositionIds.as<int64_t>();
  int64_t* poolSlot = result.poolSlot.as<int64_t>();
  for (int64_t n = 0; n < images; ++n) {
    const int64_t* image = positions + n * patches * 2;
    auto isPadding = [&](int64_t p) { return image[2 * p] == -1 && image[2 * p + 1] == -1; };
    int64_t maxX = 0;
    for (int64_t p = 0; p < patches; ++p) {
      if (isPadding(p)) continue;
      if (image[2 * p] < 0 || image[2 * p + 1] < 0)
        fail("image " + std::to_string(n) + ", patch " + std::to_string(p) + ": position (" +
             std::to_string(image[2 * p]) + ", " + std::to_string(image[2 * p + 1]) +
             ") is negative but not the padding marker (-1, -1)");
      maxX = std::max(maxX, image[2 * p] + 1);
    }
    std::vector<int64_t> buckets(patches, -1);
    for (int64_t p = 0; p < patches; ++p)
      if (!isPadding(p))
        buckets[p] = image[2 * p] / poolingKernel + (maxX / poolingKernel) * (image[2 * p + 1] / poolingKernel);
    std::vector<int64_t> occupied;
    for (int64_t bucket : buckets)
      if (bucket >= 0) occupied.push_back(bucket);
    std::sort(occupied.begin(), occupied.end());
    occupied.erase(std::unique(occupied.begin(), occupied.end()), occupied.end());
    if (static_cast<int64_t>(occupied.size()) > maxSoftTokens)
      fail("image " + std::to_string(n) + ": its patches fill " + std::to_string(occupied.size()) +
           " pooling buckets, more than the " + std::to_string(maxSoftTokens) + " soft tokens an image may give");
    pooledTokens[n] = static_cast<int64_t>(occupied.size());
    for (int64_t p = 0; p < patches; ++p) {
      if (buckets[p] < 0) {
        poolSlot[n * patches + p] = pooledRows;
        continue;
      }
      const int64_t rank = std::lower_bound(occupied.begin(), occupied.end(), buckets[p]) - occupied.begin();
      poolSlot[n * patches + p] = n * maxSoftTokens + rank;
    }
  }

  // The j-th soft token of example b takes the j-th pooled token of its images, in image order.
  const std::vector<int64_t> types = tokenTypes(mmTokenTypeIds);
  int64_t* tokenIndex = result.tokenIndex.as<int64_t>();
  int64_t* segmentIds = result.segmentIds.as<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> pooledRowsOfExample;
    for (int64_t i = 0; i < imagesPerExample; ++i) {
      const int64_t n = b * imagesPerExample + i;
      for (int64_t r = 0; r < pooledTokens[n]; ++r) pooledRowsOfExample.push_back(n * maxSoftTokens + r);
    }
    int64_t softTokens = 0, runs = 0;
    for (int64_t p = 0; p < promptLength; ++p) {
      const int64_t at = b * promptLength + p;
      const int64_t type = types[at];
      if (type != 0 && type != 1)
        fail("mm_token_type_ids[" + std::to_string(b) + ", " + std::to_string(p) +
             "]: expected 0 (text) or 1 (image), got " + std::to_string(type));
      const bool image = type == 1;
      if (image && (p == 0 || types[at - 1] != 1)) ++runs;
      segmentIds[at] = image ? runs : 0;
      tokenIndex[at] = pooledRows;
      if (!image) continue;
      if (softTokens < static_cast<int64_t>(pooledRowsOfExample.size())) tokenIndex[at] = pooledRowsOfExample[softTokens];
      ++softTokens;
    }
    if (softTokens != static_cast<int64_t>(pooledRowsOfExample.size()))
      fail("example " + std::to_string(b) + ": " + std::to_string(softTokens) + " image tokens but the images give " +
           std::to_string(pooledRowsOfExample.size()) + " pooled tokens");
  }
  return result;
}

}  // namespace dgemma
