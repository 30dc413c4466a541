// Binary ops with broadcasting, unary maps, copy and fill against reference loops in double.
#include <cmath>
#include <limits>

#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

double applyReference(const std::string& op, double a, double b) {
  if (op == "add") return a + b;
  if (op == "sub") return a - b;
  if (op == "mul") return a * b;
  if (op == "div") return a / b;
  if (op == "maximum") return a > b ? a : b;
  return a < b ? a : b;  // minimum
}

// c[i] for the broadcast of a (shape aShape) and b (shape bShape) to outShape, by explicit index math.
std::vector<double> broadcastReference(const std::string& op, const std::vector<int64_t>& outShape,
                                       const std::vector<int64_t>& aShape, const std::vector<double>& a,
                                       const std::vector<int64_t>& bShape, const std::vector<double>& b) {
  auto flatIndexIn = [&](const std::vector<int64_t>& shape, const std::vector<int64_t>& coord) {
    int64_t index = 0;
    const size_t leading = outShape.size() - shape.size();
    for (size_t d = 0; d < shape.size(); ++d) index = index * shape[d] + (shape[d] == 1 ? 0 : coord[leading + d]);
    return index;
  };
  int64_t count = 1;
  for (int64_t dim : outShape) count *= dim;
  std::vector<double> result(count);
  std::vector<int64_t> coord(outShape.size());
  for (int64_t i = 0; i < count; ++i) {
    int64_t rest = i;
    for (size_t d = outShape.size(); d-- > 0;) {
      coord[d] = rest % outShape[d];
      rest /= outShape[d];
    }
    result[i] = applyReference(op, a[flatIndexIn(aShape, coord)], b[flatIndexIn(bShape, coord)]);
  }
  return result;
}

template <typename T>
void checkBroadcast(const std::string& op, DType dtype, const std::vector<int64_t>& aShape,
                    const std::vector<int64_t>& bShape, const std::vector<int64_t>& outShape,
                    ThreadPool* threads = nullptr) {
  auto countOf = [](const std::vector<int64_t>& shape) {
    size_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return count;
  };
  std::vector<T> a = randomValues<T>(countOf(aShape), 1);
  std::vector<T> b = randomValues<T>(countOf(bShape), 2, 0.5, 3.0);  // away from 0 for div
  KernelCall call(op);
  call.input(dtype, aShape, a).input(dtype, bShape, b).output(dtype, outShape);
  call.run(threads);
  const std::vector<double> expected = broadcastReference(op, outShape, aShape, std::vector<double>(a.begin(), a.end()),
                                                          bShape, std::vector<double>(b.begin(), b.end()));
  SCOPED_TRACE(op);
  expectClose(call.result<T>(), expected, dtype == DType::F64 ? 1e-15 : 1e-6);
}

TEST(ElementwiseKernels, BinaryOpsOnEqualShapes) {
  for (const char* op : {"add", "sub", "mul", "div", "maximum", "minimum"}) {
    checkBroadcast<float>(op, DType::F32, {3, 5}, {3, 5}, {3, 5});
    checkBroadcast<double>(op, DType::F64, {7}, {7}, {7});
  }
}

TEST(ElementwiseKernels, BroadcastRowColumnAndScalar) {
  checkBroadcast<float>("add", DType::F32, {2, 3}, {3}, {2, 3});           // row vector, missing dim
  checkBroadcast<float>("mul", DType::F32, {2, 1}, {1, 3}, {2, 3});        // column times row
  checkBroadcast<float>("sub", DType::F32, {}, {4}, {4});                  // scalar on the left
  checkBroadcast<double>("div", DType::F64, {2, 3, 4}, {}, {2, 3, 4});     // scalar on the right
  checkBroadcast<double>("maximum", DType::F64, {4, 1, 3}, {2, 1}, {4, 2, 3});  // both sides broadcast
  checkBroadcast<float>("minimum", DType::F32, {3, 1, 5}, {3, 4, 1}, {3, 4, 5});
}

TEST(ElementwiseKernels, BroadcastAcrossThreadChunks) {
  ThreadPool threads(2);
  // 64 x 700 elements: more than one parallel chunk, and chunks start in the middle of rows.
  checkBroadcast<float>("add", DType::F32, {64, 700}, {700}, {64, 700}, &threads);
  checkBroadcast<float>("mul", DType::F32, {64, 1}, {64, 700}, {64, 700}, &threads);
  checkBroadcast<double>("sub", DType::F64, {64, 700}, {64, 700}, {64, 700}, &threads);
}

TEST(ElementwiseKernels, MaximumAndMinimumPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const char* op : {"maximum", "minimum"}) {
    KernelCall call(op);
    call.input<float>(DType::F32, {3}, {nan, 1.0f, 2.0f}).input<float>(DType::F32, {3}, {1.0f, nan, 3.0f});
    call.output(DType::F32, {3});
    call.run();
    const std::vector<float> c = call.result<float>();
    EXPECT_TRUE(std::isnan(c[0])) << op;
    EXPECT_TRUE(std::isnan(c[1])) << op;
    EXPECT_EQ(c[2], std::string(op) == "maximum" ? 3.0f : 2.0f);
  }
}

template <typename T>
void checkUnary(const std::string& op, DType dtype, const std::function<double(double)>& reference, double low,
                double high, ThreadPool* threads = nullptr) {
  const std::vector<T> x = randomValues<T>(20000, 3, low, high);  // more than one parallel chunk
  KernelCall call(op);
  call.input(dtype, {40, 500}, x).output(dtype, {40, 500});
  call.run(threads);
  std::vector<double> expected;
  for (T value : x) expected.push_back(reference(static_cast<double>(value)));
  SCOPED_TRACE(op);
  expectClose(call.result<T>(), expected, dtype == DType::F64 ? 1e-14 : 2e-6);
}

double geluTanhReference(double x) {
  const double pi = std::acos(-1.0);
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / pi) * (x + 0.044715 * x * x * x)));
}

TEST(ElementwiseKernels, UnaryMapsInF32AndF64) {
  struct Case {
    const char* op;
    std::function<double(double)> reference;
    double low, high;
  };
  const std::vector<Case> cases = {
      {"neg", [](double x) { return -x; }, -3, 3},
      {"exp", [](double x) { return std::exp(x); }, -3, 3},
      {"log", [](double x) { return std::log(x); }, 0.01, 10},
      {"tanh", [](double x) { return std::tanh(x); }, -4, 4},
      {"sqrt", [](double x) { return std::sqrt(x); }, 0, 10},
      {"rsqrt", [](double x) { return 1.0 / std::sqrt(x); }, 0.1, 10},
      {"gelu_tanh", geluTanhReference, -6, 6},
  };
  ThreadPool threads(2);
  for (const Case& c : cases) {
    checkUnary<float>(c.op, DType::F32, c.reference, c.low, c.high);
    checkUnary<double>(c.op, DType::F64, c.reference, c.low, c.high, &threads);
  }
}

TEST(ElementwiseKernels, CopyMovesAnyDType) {
  const std::vector<int64_t> ids = {5, -7, int64_t{1} << 40, 0};
  KernelCall call("copy");
  call.input(DType::I64, {2, 2}, ids).output(DType::I64, {2, 2});
  call.run();
  EXPECT_EQ(call.result<int64_t>(), ids);
}

TEST(ElementwiseKernels, FillWritesTheValueInEachDType) {
  ThreadPool threads(2);
  KernelCall f32("fill", {{"value", -1.5}});
  f32.output(DType::F32, {100, 300});
  f32.run(&threads);
  EXPECT_EQ(f32.result<float>(), std::vector<float>(30000, -1.5f));

  KernelCall bf16("fill", {{"value", 1.0 + 3.0 / 256}});  // a bf16 tie: rounds to the even 1 + 2^-6
  bf16.output(DType::BF16, {3});
  bf16.run();
  EXPECT_EQ(bf16.result<uint16_t>(), std::vector<uint16_t>(3, 0x3f82));

  KernelCall i32("fill", {{"value", -3}});
  i32.output(DType::I32, {5});
  i32.run();
  EXPECT_EQ(i32.result<int32_t>(), std::vector<int32_t>(5, -3));

  KernelCall f64("fill", {{"value", 0.1}});
  f64.output(DType::F64, {2});
  f64.run();
  EXPECT_EQ(f64.result<double>(), std::vector<double>(2, 0.1));
}

}  // namespace
}  // namespace dgemma::test
