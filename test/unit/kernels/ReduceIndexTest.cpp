// runtime/kernels/reduce/ReduceIndex.h, the index maps the CUDA reduction walks, checked on the host:
// the offsets keptOffset(o) + reducedOffset(r) visit every element of x exactly once, and reducing
// through them gives the CPU kernel's output bit for bit (max exactly; sums of small integers, exact
// in any order).
#include <cmath>

#include "KernelTestSupport.h"
#include "runtime/kernels/reduce/ReduceIndex.h"
#include "support/Shape.h"

namespace dgemma::test {
namespace {

struct ReduceCase {
  std::vector<int64_t> shape, dims;
};

ReduceContract contractOf(const ReduceCase& c) {
  ReduceContract contract;
  for (int64_t d = 0, next = 0; d < static_cast<int64_t>(c.shape.size()); ++d) {
    const bool reduced = next < static_cast<int64_t>(c.dims.size()) && c.dims[next] == d;
    (reduced ? contract.reducedDims : contract.keptDims).push_back(d);
    next += reduced;
  }
  return contract;
}

std::vector<int64_t> outputShape(const ReduceCase& c) {
  std::vector<int64_t> shape;
  for (int64_t d : contractOf(c).keptDims) shape.push_back(c.shape[d]);
  return shape;
}

const std::vector<ReduceCase> kCases = {
    {{5, 7}, {1}},          {{5, 7}, {0}},          {{5, 7}, {0, 1}},        {{3, 4, 5}, {1}},
    {{3, 4, 5}, {0, 2}},    {{3, 4, 5}, {1, 2}},    {{2, 1, 3, 1, 4}, {1, 3}}, {{2, 3, 4, 5, 6}, {0, 2, 4}},
    {{2, 3, 4, 5, 6}, {1, 3}}, {{6}, {}},            {{4, 0, 3}, {1}},         {{2, 2, 2, 2, 2, 2, 2, 2, 2, 2}, {0, 2, 4, 6, 8}},
};

TEST(ReduceIndexTest, VisitsEveryElementOnce) {
  for (const ReduceCase& c : kCases) {
    reduce::ReduceGeometry geometry;
    ASSERT_TRUE(reduce::makeReduceGeometry(c.shape, contractOf(c), geometry)) << shapeToString(c.shape);
    std::vector<int> visits(static_cast<size_t>(numElementsOf(c.shape)), 0);
    for (int64_t o = 0; o < geometry.kept.count; ++o)
      for (int64_t r = 0; r < geometry.reduced.count; ++r) {
        const int64_t offset = reduce::offsetOf(geometry.kept, o) + reduce::offsetOf(geometry.reduced, r);
        ASSERT_GE(offset, 0);
        ASSERT_LT(offset, static_cast<int64_t>(visits.size()));
        ++visits[static_cast<size_t>(offset)];
      }
    for (size_t i = 0; i < visits.size(); ++i)
      EXPECT_EQ(visits[i], 1) << shapeToString(c.shape) << " over " << shapeToString(c.dims) << ", element " << i;
  }
}

TEST(ReduceIndexTest, MergesContiguousDims) {
  reduce::ReduceGeometry geometry;
  ASSERT_TRUE(reduce::makeReduceGeometry({2, 3, 4, 5}, contractOf({{2, 3, 4, 5}, {2, 3}}), geometry));
  EXPECT_EQ(geometry.reduced.rank, 1);  // a row reduction over 20 contiguous elements
  EXPECT_EQ(geometry.reduced.strides[0], 1);
  EXPECT_EQ(geometry.reduced.count, 20);
  EXPECT_EQ(geometry.kept.rank, 1);
  EXPECT_EQ(geometry.kept.strides[0], 20);
}

TEST(ReduceIndexTest, MatchesTheCpuKernel) {
  std::mt19937 generator(5);
  std::uniform_int_distribution<int> small(-50, 50);
  for (const ReduceCase& c : kCases) {
    std::vector<float> x(static_cast<size_t>(numElementsOf(c.shape)));
    for (float& value : x) value = static_cast<float>(small(generator));
    if (x.size() > 3) x[3] = std::nanf("");  // NaN wins the max of its output
    reduce::ReduceGeometry geometry;
    ASSERT_TRUE(reduce::makeReduceGeometry(c.shape, contractOf(c), geometry));
    for (const char* op : {"reduce_sum", "reduce_max", "reduce_mean"}) {
      KernelCall call(op, {{"dims", c.dims}, {"keep_dims", false}});
      call.input(DType::F32, c.shape, x).output(DType::F32, outputShape(c));
      call.run();
      const std::vector<float> cpu = call.result<float>(0);
      ASSERT_EQ(static_cast<int64_t>(cpu.size()), geometry.kept.count);
      for (int64_t o = 0; o < geometry.kept.count; ++o) {
        double sum = 0;
        float maximum = -INFINITY;
        for (int64_t r = 0; r < geometry.reduced.count; ++r) {
          const float value = x[reduce::offsetOf(geometry.kept, o) + reduce::offsetOf(geometry.reduced, r)];
          sum += value;
          maximum = reduce::maxStep(maximum, value);
        }
        const std::string name = op;
        const float expected = name == "reduce_max"    ? maximum
                               : name == "reduce_sum" ? static_cast<float>(sum)
                                                     : static_cast<float>(sum / static_cast<double>(geometry.reduced.count));
        if (std::isnan(expected))
          EXPECT_TRUE(std::isnan(cpu[o])) << op << " " << shapeToString(c.shape) << " output " << o;
        else
          EXPECT_EQ(cpu[o], expected) << op << " " << shapeToString(c.shape) << " over " << shapeToString(c.dims)
                                      << " output " << o;
      }
    }
  }
}

TEST(ReduceIndexTest, RejectsTooManySeparateDims) {
  // Nine kept dims of size 2 separated by reduced ones cannot merge.
  ReduceCase c;
  for (int d = 0; d < 18; ++d) c.shape.push_back(2);
  for (int d = 1; d < 18; d += 2) c.dims.push_back(d);
  reduce::ReduceGeometry geometry;
  EXPECT_FALSE(reduce::makeReduceGeometry(c.shape, contractOf(c), geometry));
}

}  // namespace
}  // namespace dgemma::test
