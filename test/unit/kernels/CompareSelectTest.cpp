// compare (IEEE predicates into bool) and select (condition ? on_true : on_false), both with NumPy
// broadcasting, against hand-written answers and index-by-index loops.
#include <cmath>
#include <limits>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

template <typename T>
std::vector<uint8_t> compare(DType dtype, const std::string& predicate, std::vector<int64_t> aShape, const std::vector<T>& a,
                             std::vector<int64_t> bShape, const std::vector<T>& b, std::vector<int64_t> outShape,
                             ThreadPool* threads = nullptr) {
  KernelCall call("compare", {{"predicate", predicate}});
  call.input(dtype, std::move(aShape), a).input(dtype, std::move(bShape), b).output(DType::Bool, std::move(outShape));
  call.run(threads);
  return call.result<uint8_t>();
}

template <typename T>
void checkPredicatesIncludingNaNAndSignedZero(DType dtype) {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  const std::vector<T> a = {1, 2, nan, T(-0.0), 3};
  const std::vector<T> b = {2, 2, 1, T(0.0), nan};
  // Columns: 1 vs 2, 2 vs 2, NaN vs 1, -0 vs +0, 3 vs NaN. Every comparison with NaN is false but ne.
  const std::vector<std::pair<std::string, std::vector<uint8_t>>> expected = {
      {"lt", {1, 0, 0, 0, 0}}, {"le", {1, 1, 0, 1, 0}}, {"gt", {0, 0, 0, 0, 0}},
      {"ge", {0, 1, 0, 1, 0}}, {"eq", {0, 1, 0, 1, 0}}, {"ne", {1, 0, 1, 0, 1}},
  };
  for (const auto& [predicate, answer] : expected)
    EXPECT_EQ(compare<T>(dtype, predicate, {5}, a, {5}, b, {5}), answer) << predicate;
}

TEST(CompareKernel, EveryPredicateInF32AndF64) {
  checkPredicatesIncludingNaNAndSignedZero<float>(DType::F32);
  checkPredicatesIncludingNaNAndSignedZero<double>(DType::F64);
}

TEST(CompareKernel, BroadcastsAColumnAndAScalar) {
  // [2, 3] against a per-row threshold [2, 1]: the corruption's u < t.
  EXPECT_EQ(compare<double>(DType::F64, "lt", {2, 3}, {0.1, 0.5, 0.9, 0.1, 0.5, 0.9}, {2, 1}, {0.5, 0.95}, {2, 3}),
            (std::vector<uint8_t>{1, 0, 0, 1, 1, 1}));
  // A scalar on the left: 0 < mask.
  EXPECT_EQ(compare<float>(DType::F32, "lt", {}, {0.0f}, {4}, {1.0f, 0.0f, 2.0f, -1.0f}, {4}),
            (std::vector<uint8_t>{1, 0, 1, 0}));
}

TEST(CompareKernel, ManyElementsAcrossThreads) {
  ThreadPool threads(2);
  const std::vector<float> a = randomValues<float>(64 * 700, 5);
  const std::vector<float> b = randomValues<float>(700, 6);
  const std::vector<uint8_t> c = compare<float>(DType::F32, "ge", {64, 700}, a, {700}, b, {64, 700}, &threads);
  for (int64_t row = 0; row < 64; ++row)
    for (int64_t column = 0; column < 700; ++column)
      ASSERT_EQ(c[row * 700 + column], a[row * 700 + column] >= b[column] ? 1 : 0) << row << ", " << column;
}

TEST(CompareKernel, RejectsUnknownPredicatesAndNonBoolOutputs) {
  KernelCall unknown("compare", {{"predicate", "less"}});
  unknown.input<float>(DType::F32, {2}, {1, 2}).input<float>(DType::F32, {2}, {1, 2}).output(DType::Bool, {2});
  EXPECT_EQ(factoryError(unknown), "step 0 (compare): attribute 'predicate': expected lt, le, gt, ge, eq or ne, got 'less'");
  KernelCall floats("compare", {{"predicate", "lt"}});
  floats.input<float>(DType::F32, {2}, {1, 2}).input<float>(DType::F32, {2}, {1, 2}).output(DType::F32, {2});
  EXPECT_EQ(factoryError(floats), "step 0 (compare): output c has dtype f32, expected bool");
  KernelCall shapes("compare", {{"predicate", "lt"}});
  shapes.input<float>(DType::F32, {2}, {1, 2}).input<float>(DType::F32, {3}, {1, 2, 3}).output(DType::Bool, {3});
  EXPECT_EQ(factoryError(shapes), "step 0 (compare): inputs a [2] and b [3] do not broadcast");
}

TEST(SelectKernel, PicksIdsAndFloatsWithBroadcasting) {
  // The corruption: where selected, the replacement id, else the original; the condition is a row.
  KernelCall ids("select");
  ids.input<uint8_t>(DType::Bool, {3}, {0, 1, 1})
      .input<int64_t>(DType::I64, {2, 3}, {10, 11, 12, 13, 14, 15})
      .input<int64_t>(DType::I64, {2, 1}, {-1, -2})
      .output(DType::I64, {2, 3});
  ids.run();
  EXPECT_EQ(ids.result<int64_t>(), (std::vector<int64_t>{-1, 11, 12, -2, 14, 15}));

  // A column condition and a scalar fallback in f32.
  KernelCall floats("select");
  floats.input<uint8_t>(DType::Bool, {2, 1}, {1, 0})
      .input<float>(DType::F32, {2, 2}, {1.5f, 2.5f, 3.5f, 4.5f})
      .input<float>(DType::F32, {}, {-7.0f})
      .output(DType::F32, {2, 2});
  floats.run();
  EXPECT_EQ(floats.result<float>(), (std::vector<float>{1.5f, 2.5f, -7.0f, -7.0f}));

  // f64, with the condition the only full-size operand.
  KernelCall doubles("select");
  doubles.input<uint8_t>(DType::Bool, {4}, {1, 0, 0, 1})
      .input<double>(DType::F64, {1}, {0.25})
      .input<double>(DType::F64, {}, {1e300})
      .output(DType::F64, {4});
  doubles.run();
  EXPECT_EQ(doubles.result<double>(), (std::vector<double>{0.25, 1e300, 1e300, 0.25}));
}

TEST(SelectKernel, ManyElementsAcrossThreads) {
  ThreadPool threads(2);
  std::vector<uint8_t> condition(64 * 700);
  for (size_t i = 0; i < condition.size(); ++i) condition[i] = (i * 7919) % 3 == 0;
  const std::vector<float> onTrue = randomValues<float>(700, 8);
  const std::vector<float> onFalse = randomValues<float>(64, 9);
  KernelCall call("select");
  call.input(DType::Bool, {64, 700}, condition).input(DType::F32, {700}, onTrue).input(DType::F32, {64, 1}, onFalse);
  call.output(DType::F32, {64, 700});
  call.run(&threads);
  const std::vector<float> y = call.result<float>();
  for (int64_t row = 0; row < 64; ++row)
    for (int64_t column = 0; column < 700; ++column)
      ASSERT_EQ(y[row * 700 + column], condition[row * 700 + column] ? onTrue[column] : onFalse[row]) << row << ", " << column;
}

TEST(SelectKernel, RejectsANonBoolConditionAndMixedValues) {
  KernelCall condition("select");
  condition.input<float>(DType::F32, {2}, {1, 0}).input<float>(DType::F32, {2}, {1, 2}).input<float>(DType::F32, {2}, {3, 4});
  condition.output(DType::F32, {2});
  EXPECT_EQ(factoryError(condition), "step 0 (select): input condition has dtype f32, expected bool");
  KernelCall mixed("select");
  mixed.input<uint8_t>(DType::Bool, {2}, {1, 0}).input<int64_t>(DType::I64, {2}, {1, 2}).input<float>(DType::F32, {2}, {3, 4});
  mixed.output(DType::I64, {2});
  EXPECT_EQ(factoryError(mixed), "step 0 (select): input on_false has dtype f32, expected i64");
  KernelCall shapes("select");
  shapes.input<uint8_t>(DType::Bool, {2}, {1, 0}).input<float>(DType::F32, {3}, {1, 2, 3}).input<float>(DType::F32, {}, {0});
  shapes.output(DType::F32, {3});
  EXPECT_EQ(factoryError(shapes), "step 0 (select): inputs condition [2], on_true [3] and on_false [] do not broadcast");
}

}  // namespace
}  // namespace dgemma::test
