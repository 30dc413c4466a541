// runtime/kernels/gather/RowMap.h and the CUDA scatter_add's order, checked on the host against the
// CPU kernels: gather through localRowOf, and scatter_add as the CUDA kernel computes it (positions
// stably sorted by scatterRowOf's row, each row's updates summed from zero in that order) equal the
// CPU kernels' outputs bit for bit.
#include <algorithm>
#include <numeric>

#include "KernelTestSupport.h"
#include "runtime/kernels/gather/RowMap.h"

namespace dgemma::test {
namespace {

TEST(GatherRowMapTest, RowsOfABlock) {
  EXPECT_EQ(gather::localRowOf(5, 0, 10), 5);
  EXPECT_EQ(gather::localRowOf(5, 5, 10), 0);
  EXPECT_EQ(gather::localRowOf(14, 5, 10), 9);
  EXPECT_EQ(gather::localRowOf(15, 5, 10), gather::kNoRow);
  EXPECT_EQ(gather::localRowOf(4, 5, 10), gather::kNoRow);
  EXPECT_EQ(gather::localRowOf(-1, 0, 10), gather::kNoRow);
  EXPECT_EQ(gather::scatterRowOf(7, true, 7, 5, 10), gather::kNoRow);
  EXPECT_EQ(gather::scatterRowOf(7, false, 7, 5, 10), 2);
  EXPECT_EQ(gather::scatterRowOf(8, true, 7, 5, 10), 3);
}

TEST(GatherRowMapTest, GatherMatchesTheCpuKernel) {
  const int64_t vocabulary = 6, width = 3, rowOffset = 4;
  const std::vector<float> table = randomValues<float>(vocabulary * width, 41);
  const std::vector<int64_t> ids = {4, 9, 10, 0, 3, 7, 7, 100};
  KernelCall call("gather", {{"row_offset", rowOffset}});
  call.input(DType::F32, {vocabulary, width}, table).input(DType::I64, {8}, ids).output(DType::F32, {8, width});
  call.run();
  const std::vector<float> y = call.result<float>();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t row = gather::localRowOf(ids[i], rowOffset, vocabulary);
    for (int64_t h = 0; h < width; ++h)
      EXPECT_EQ(y[i * width + h], row == gather::kNoRow ? 0.0f : table[row * width + h]) << i << ", " << h;
  }
}

TEST(GatherRowMapTest, SortedSegmentSumsMatchTheCpuScatterAdd) {
  const int64_t vocabulary = 17, width = 5, rowOffset = 3, skipId = 6, count = 400;
  std::mt19937 generator(43);
  std::uniform_int_distribution<int64_t> id(0, 24);  // some below, some above the block
  std::vector<int64_t> ids(count);
  for (int64_t& value : ids) value = id(generator);
  const std::vector<float> updates = randomValues<float>(count * width, 44);  // sums that round
  KernelCall call("scatter_add", {{"row_offset", rowOffset}, {"skip_id", skipId}});
  call.input(DType::I64, {count}, ids).input(DType::F32, {count, width}, updates).output(DType::F32, {vocabulary, width});
  call.run();
  const std::vector<float> cpu = call.result<float>();

  // The CUDA kernel's steps: key = row or V, a stable sort, one sum per (row, column) from zero.
  std::vector<int64_t> keys(count), positions(count);
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = gather::scatterRowOf(ids[i], true, skipId, rowOffset, vocabulary);
    keys[i] = row == gather::kNoRow ? vocabulary : row;
  }
  std::iota(positions.begin(), positions.end(), 0);
  std::stable_sort(positions.begin(), positions.end(), [&](int64_t a, int64_t b) { return keys[a] < keys[b]; });
  std::vector<float> emulated(vocabulary * width, 0.0f);
  for (int64_t j = 0; j < count; ++j) {
    const int64_t row = keys[positions[j]];
    if (row == vocabulary || (j > 0 && keys[positions[j - 1]] == row)) continue;
    for (int64_t h = 0; h < width; ++h) {
      float sum = 0.0f;
      for (int64_t k = j; k < count && keys[positions[k]] == row; ++k) sum += updates[positions[k] * width + h];
      emulated[row * width + h] = sum;
    }
  }
  ASSERT_EQ(cpu.size(), emulated.size());
  EXPECT_EQ(std::memcmp(cpu.data(), emulated.data(), cpu.size() * sizeof(float)), 0);
  EXPECT_EQ(cpu[(skipId - rowOffset) * width], 0.0f);  // the skipped row stays zero
}

}  // namespace
}  // namespace dgemma::test
