// runtime/kernels/layout/TransposeIndex.h, the map the CUDA transpose reads x through, checked on the
// host: y[index] = x[sourceOffset(map, index)] equals the CPU kernel's transpose for several
// permutations (size-1 dims among them, which the map drops), and too many dims are refused.
#include <numeric>

#include "KernelTestSupport.h"
#include "runtime/kernels/layout/TransposeIndex.h"
#include "support/Shape.h"

namespace dgemma::test {
namespace {

TEST(TransposeIndexTest, MatchesTheCpuKernel) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> cases = {
      {{3, 4}, {1, 0}},          {{2, 3, 4}, {0, 2, 1}},       {{2, 3, 4}, {2, 0, 1}}, {{2, 1, 3, 1, 4}, {4, 3, 0, 2, 1}},
      {{5}, {0}},                {{2, 3, 4, 5}, {3, 1, 2, 0}}, {{0, 3}, {1, 0}},       {{1, 1}, {1, 0}}};
  for (const auto& [shape, perm] : cases) {
    std::vector<int32_t> x(static_cast<size_t>(numElementsOf(shape)));
    std::iota(x.begin(), x.end(), 100);
    std::vector<int64_t> yShape;
    for (int64_t from : perm) yShape.push_back(shape[from]);
    KernelCall call("transpose", {{"perm", perm}});
    call.input(DType::I32, shape, x).output(DType::I32, yShape);
    call.run();
    const std::vector<int32_t> cpu = call.result<int32_t>();
    layout::TransposeMap map;
    ASSERT_TRUE(layout::makeTransposeMap(shape, perm, map));
    for (size_t index = 0; index < cpu.size(); ++index)
      ASSERT_EQ(cpu[index], x[layout::sourceOffset(map, static_cast<int64_t>(index))])
          << shapeToString(shape) << " by " << shapeToString(perm) << ", element " << index;
  }
}

TEST(TransposeIndexTest, RefusesMoreThanEightMovingDims) {
  const std::vector<int64_t> shape(9, 2);
  std::vector<int64_t> perm(9);
  std::iota(perm.rbegin(), perm.rend(), 0);
  layout::TransposeMap map;
  EXPECT_FALSE(layout::makeTransposeMap(shape, perm, map));
  std::vector<int64_t> withOnes = shape;
  withOnes[4] = 1;  // eight dims above 1: fits
  EXPECT_TRUE(layout::makeTransposeMap(withOnes, perm, map));
}

}  // namespace
}  // namespace dgemma::test
