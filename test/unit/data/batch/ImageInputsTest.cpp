#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/data/batch/ImageInputs.h"
#include "support/Error.h"

namespace dgemma {
namespace {

// Patch positions as the processor lays them out: row-major (y outer, x inner) over a width x
// height grid of patches, then (-1, -1) up to `patches`.
std::vector<int64_t> gridPositions(int64_t width, int64_t height, int64_t patches) {
  std::vector<int64_t> positions;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x) positions.insert(positions.end(), {x, y});
  while (static_cast<int64_t>(positions.size()) < 2 * patches) positions.insert(positions.end(), {-1, -1});
  return positions;
}

HostTensor positionIds(const std::vector<std::vector<int64_t>>& images, int64_t patches) {
  HostTensor tensor(DType::I64, {static_cast<int64_t>(images.size()), patches, 2});
  for (size_t n = 0; n < images.size(); ++n)
    std::copy(images[n].begin(), images[n].end(), tensor.as<int64_t>() + n * patches * 2);
  return tensor;
}

HostTensor tokenTypes(const std::vector<std::vector<int64_t>>& rows, DType dtype = DType::I64) {
  HostTensor tensor(dtype, {static_cast<int64_t>(rows.size()), static_cast<int64_t>(rows.front().size())});
  for (size_t b = 0; b < rows.size(); ++b)
    for (size_t p = 0; p < rows[b].size(); ++p) {
      const size_t at = b * rows[b].size() + p;
      if (dtype == DType::I32) tensor.as<int32_t>()[at] = static_cast<int32_t>(rows[b][p]);
      else tensor.as<int64_t>()[at] = rows[b][p];
    }
  return tensor;
}

std::vector<int64_t> ints(const HostTensor& tensor) {
  return std::vector<int64_t>(tensor.as<int64_t>(), tensor.as<int64_t>() + tensor.numElements());
}

std::string errorOf(const HostTensor& positions, const HostTensor& types, int64_t imagesPerExample, int64_t kernel,
                    int64_t softTokens) {
  try {
    deriveImagePlanInputs(positions, types, imagesPerExample, kernel, softTokens);
  } catch (const InputError& error) {
    return error.what();
  }
  return "no error";
}

// k = 3, T = 4 (N_p = 36): a 6 x 6 grid fills the four buckets; a 6 x 3 grid two, its other 18
// patches are padding and point past the pooled list (N·T = 4).
TEST(DeriveImagePlanInputs, PaddingPatchesPointPastThePooledList) {
  const HostTensor positions = positionIds({gridPositions(6, 3, 36)}, 36);
  const ImagePlanInputs inputs = deriveImagePlanInputs(positions, tokenTypes({{0, 1, 1, 0}}), 1, 3, 4);
  const std::vector<int64_t> slots = ints(inputs.poolSlot);
  ASSERT_EQ(inputs.poolSlot.shape, (std::vector<int64_t>{1, 36}));
  for (int64_t x = 0; x < 6; ++x)
    for (int64_t y = 0; y < 3; ++y) EXPECT_EQ(slots[y * 6 + x], x / 3) << "patch (" << x << ", " << y << ")";
  for (int64_t p = 18; p < 36; ++p) EXPECT_EQ(slots[p], 4) << "padding patch " << p;
  EXPECT_EQ(ints(inputs.tokenIndex), (std::vector<int64_t>{4, 0, 1, 4}));
  EXPECT_EQ(ints(inputs.segmentIds), (std::vector<int64_t>{0, 1, 1, 0}));
}

// Non-square grids: the bucket of (x, y) is x/k + (max_x / k)·(y/k), so a wide image numbers its
// buckets along x and a tall one along y; the occupied buckets are ranked in ascending order.
TEST(DeriveImagePlanInputs, NonSquareImagesRankBucketsRowMajor) {
  const HostTensor positions = positionIds({gridPositions(9, 3, 36), gridPositions(3, 6, 36)}, 36);
  const ImagePlanInputs inputs = deriveImagePlanInputs(positions, tokenTypes({{1, 1, 1, 0}, {0, 1, 1, 0}}, DType::I32), 1, 3, 4);
  const std::vector<int64_t> slots = ints(inputs.poolSlot);
  for (int64_t x = 0; x < 9; ++x)
    for (int64_t y = 0; y < 3; ++y) EXPECT_EQ(slots[y * 9 + x], x / 3) << "wide patch (" << x << ", " << y << ")";
  for (int64_t x = 0; x < 3; ++x)
    for (int64_t y = 0; y < 6; ++y) EXPECT_EQ(slots[36 + y * 3 + x], 4 + y / 3) << "tall patch (" << x << ", " << y << ")";
  for (int64_t p = 27; p < 36; ++p) EXPECT_EQ(slots[p], 8);
  for (int64_t p = 36 + 18; p < 72; ++p) EXPECT_EQ(slots[p], 8);
  EXPECT_EQ(ints(inputs.tokenIndex), (std::vector<int64_t>{0, 1, 2, 8, 8, 4, 5, 8}));
}

// A bucket grid with a hole: the patches of a 6 x 6 image with the top-right 3 x 3 block missing
// (positions listed out of order) occupy buckets 0, 2, 3, ranked 0, 1, 2.
TEST(DeriveImagePlanInputs, RanksSkipEmptyBucketsAndIgnorePatchOrder) {
  std::vector<int64_t> positions;
  for (int64_t y = 5; y >= 0; --y)
    for (int64_t x = 0; x < 6; ++x)
      if (!(x >= 3 && y < 3)) positions.insert(positions.end(), {x, y});
  while (positions.size() < 72) positions.insert(positions.end(), {-1, -1});
  const ImagePlanInputs inputs = deriveImagePlanInputs(positionIds({positions}, 36), tokenTypes({{1, 1, 1}}), 1, 3, 4);
  const std::vector<int64_t> slots = ints(inputs.poolSlot);
  for (size_t p = 0; p < 27; ++p) {
    const int64_t x = positions[2 * p], y = positions[2 * p + 1];
    const int64_t bucket = x / 3 + 2 * (y / 3);
    EXPECT_EQ(slots[p], bucket == 0 ? 0 : bucket - 1) << "patch (" << x << ", " << y << ")";
  }
  EXPECT_EQ(ints(inputs.tokenIndex), (std::vector<int64_t>{0, 1, 2}));
}

// Two images per example, two examples: example b's soft tokens take image 2b's pooled tokens, then
// image 2b+1's, across separate runs; each run gets its own segment id.
TEST(DeriveImagePlanInputs, TwoImagesPerExample) {
  const HostTensor positions = positionIds(
      {gridPositions(3, 3, 9 * 2), gridPositions(6, 3, 18), gridPositions(3, 6, 18), gridPositions(3, 3, 18)}, 18);
  const HostTensor types = tokenTypes({{0, 1, 0, 1, 1, 0, 0}, {1, 1, 0, 1, 0, 0, 0}});
  const ImagePlanInputs inputs = deriveImagePlanInputs(positions, types, 2, 3, 2);
  ASSERT_EQ(inputs.poolSlot.shape, (std::vector<int64_t>{4, 18}));
  // N·T = 8. Image 0: 1 token (row 0); image 1: 2 (rows 2, 3); image 2: 2 (rows 4, 5); image 3: 1 (row 6).
  EXPECT_EQ(ints(inputs.tokenIndex), (std::vector<int64_t>{8, 0, 8, 2, 3, 8, 8, 4, 5, 8, 6, 8, 8, 8}));
  EXPECT_EQ(ints(inputs.segmentIds), (std::vector<int64_t>{0, 1, 0, 2, 2, 0, 0, 1, 1, 0, 2, 0, 0, 0}));
  const std::vector<int64_t> slots = ints(inputs.poolSlot);
  EXPECT_EQ(slots[0], 0);
  EXPECT_EQ(slots[9], 8);                  // image 0's first padding patch
  EXPECT_EQ(slots[18 + 5], 3);             // image 1, patch (5, 0): second bucket
  EXPECT_EQ(slots[36 + 3 * 3], 5);         // image 2, patch (0, 3): second bucket
  EXPECT_EQ(slots[54 + 8], 6);             // image 3's last valid patch
}

TEST(DeriveImagePlanInputs, TokenCountMismatchIsAnInputError) {
  const HostTensor positions = positionIds({gridPositions(6, 3, 36)}, 36);
  EXPECT_EQ(errorOf(positions, tokenTypes({{1, 1, 1, 0}}), 1, 3, 4),
            "image plan inputs: example 0: 3 image tokens but the images give 2 pooled tokens");
  EXPECT_EQ(errorOf(positions, tokenTypes({{0, 1, 0, 0}}), 1, 3, 4),
            "image plan inputs: example 0: 1 image tokens but the images give 2 pooled tokens");
}

TEST(DeriveImagePlanInputs, InconsistentInputsAreInputErrors) {
  const HostTensor positions = positionIds({gridPositions(6, 6, 36)}, 36);
  EXPECT_EQ(errorOf(positions, tokenTypes({{1, 1, 1, 1}}), 1, 3, 3),
            "image plan inputs: image 0: its patches fill 4 pooling buckets, more than the 3 soft tokens an image may give");
  EXPECT_EQ(errorOf(positions, tokenTypes({{1, 1, 1, 1}, {1, 1, 1, 1}}), 1, 3, 4),
            "image plan inputs: image_position_ids holds 1 images, expected 2 examples x 1 images per example");
  EXPECT_EQ(errorOf(positions, tokenTypes({{1, 2, 1, 1}}), 1, 3, 4),
            "image plan inputs: mm_token_type_ids[0, 1]: expected 0 (text) or 1 (image), got 2");
  std::vector<int64_t> bent = gridPositions(6, 6, 36);
  bent[2 * 7] = -1;  // patch 7: (-1, 1)
  EXPECT_EQ(errorOf(positionIds({bent}, 36), tokenTypes({{1, 1, 1, 1}}), 1, 3, 4),
            "image plan inputs: image 0, patch 7: position (-1, 1) is negative but not the padding marker (-1, -1)");
  HostTensor floats(DType::F32, {1, 36, 2});
  EXPECT_EQ(errorOf(floats, tokenTypes({{1}}), 1, 3, 4),
            "image plan inputs: image_position_ids: expected i64 [N, N_p, 2], got f32 [1,36,2]");
}

}  // namespace
}  // namespace dgemma
