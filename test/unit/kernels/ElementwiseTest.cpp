// Binary ops with broadcasting, unary maps, copy and fill against reference loops in double, and the
// f32 exp and tanh those maps use against libm.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "KernelTestSupport.h"
#include "runtime/kernels/FastMath.h"

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

// ---------------------------------------------------------------------------------------------
// fastExp and fastTanh (runtime/kernels/FastMath.h), which the exp, tanh and gelu_tanh kernels use
// for f32, against the f64 libm functions: at most 2 ulp of the correctly rounded f32 result over a
// sweep of every sign and exponent, and exact at the special values (±0, ±inf, NaN, the overflow
// and underflow edges).

float floatFromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// |actual − exact| in units of the f32 spacing at the exact value (the subnormal spacing below the
// normal range). Where the exact value rounds to an f32 infinity, only that infinity is right; NaN
// must meet NaN.
double ulpError(float actual, double exact) {
  if (std::isnan(exact)) return std::isnan(actual) ? 0.0 : std::numeric_limits<double>::infinity();
  const float rounded = std::fabs(static_cast<float>(exact));
  if (std::isinf(rounded) || std::isinf(actual))
    return actual == static_cast<float>(exact) ? 0.0 : std::numeric_limits<double>::infinity();
  const double spacing = rounded < std::numeric_limits<float>::min()
                             ? static_cast<double>(std::numeric_limits<float>::denorm_min())
                             : static_cast<double>(std::nextafter(rounded, std::numeric_limits<float>::infinity())) -
                                   static_cast<double>(rounded);
  return std::fabs(static_cast<double>(actual) - exact) / spacing;
}

// Every 257th bit pattern: about 16.7 million floats, covering each exponent of both signs densely.
template <typename Fast, typename Exact>
void expectWithinUlps(Fast fast, Exact exact, double maximumUlps) {
  double worst = 0;
  float worstAt = 0;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 257) {
    const float x = floatFromBits(static_cast<uint32_t>(bits));
    const double error = ulpError(fast(x), exact(static_cast<double>(x)));
    if (!(error <= worst)) {
      worst = error;
      worstAt = x;
    }
  }
  EXPECT_LE(worst, maximumUlps) << "worst at x = " << worstAt;
}

TEST(FastMathTest, ExpIsWithinTwoUlps) {
  expectWithinUlps([](float x) { return cpu::fastExp(x); }, [](double x) { return std::exp(x); }, 2.0);
}

TEST(FastMathTest, TanhIsWithinTwoUlps) {
  expectWithinUlps([](float x) { return cpu::fastTanh(x); }, [](double x) { return std::tanh(x); }, 2.0);
}

TEST(FastMathTest, ExpSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::fastExp(0.0f), 1.0f);
  EXPECT_EQ(cpu::fastExp(-0.0f), 1.0f);
  EXPECT_EQ(cpu::fastExp(inf), inf);
  EXPECT_EQ(cpu::fastExp(-inf), 0.0f);
  EXPECT_TRUE(std::isnan(cpu::fastExp(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::fastExp(88.8f), inf);   // past the largest f32
  EXPECT_EQ(cpu::fastExp(1000.0f), inf);
  EXPECT_EQ(cpu::fastExp(-104.0f), 0.0f);  // below half the smallest subnormal
  EXPECT_EQ(cpu::fastExp(-1000.0f), 0.0f);
  // Near the top and in the subnormals the result still rounds as the exact value does.
  for (float x : {88.7f, 88.72f, -88.0f, -100.0f, -103.9f})
    EXPECT_LE(ulpError(cpu::fastExp(x), std::exp(static_cast<double>(x))), 2.0) << "at x = " << x;
}

TEST(FastMathTest, TanhSpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(cpu::fastTanh(0.0f), 0.0f);
  EXPECT_TRUE(std::signbit(cpu::fastTanh(-0.0f)));
  EXPECT_EQ(cpu::fastTanh(inf), 1.0f);
  EXPECT_EQ(cpu::fastTanh(-inf), -1.0f);
  EXPECT_EQ(cpu::fastTanh(50.0f), 1.0f);
  EXPECT_EQ(cpu::fastTanh(-1e30f), -1.0f);
  EXPECT_TRUE(std::isnan(cpu::fastTanh(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_EQ(cpu::fastTanh(1e-30f), 1e-30f);  // tiny arguments come back exactly
  EXPECT_EQ(cpu::fastTanh(std::numeric_limits<float>::denorm_min()), std::numeric_limits<float>::denorm_min());
}

// Where the two formulas of fastTanh meet, the result stays monotonic.
TEST(FastMathTest, TanhIsMonotonicAcrossTheFormulaSwitch) {
  float previous = cpu::fastTanh(0.6f);
  for (float x = std::nextafter(0.6f, 1.0f); x < 0.65f; x = std::nextafter(x, 1.0f)) {
    const float value = cpu::fastTanh(x);
    ASSERT_GE(value, previous) << "at x = " << x;
    previous = value;
  }
}

// The exp and tanh kernels run their f32 loops in a clone for the CPU at hand (AVX2 and FMA where
// available), which rounds differently from the inline functions above: the same bound holds there.
TEST(FastMathTest, ExpAndTanhKernelsAreWithinTwoUlps) {
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4099) x.push_back(floatFromBits(static_cast<uint32_t>(bits)));
  ThreadPool threads(2);
  for (const char* op : {"exp", "tanh"}) {
    KernelCall call(op);
    call.input(DType::F32, {static_cast<int64_t>(x.size())}, x).output(DType::F32, {static_cast<int64_t>(x.size())});
    call.run(&threads);
    const std::vector<float> y = call.result<float>();
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double exact = op == std::string("exp") ? std::exp(static_cast<double>(x[i])) : std::tanh(static_cast<double>(x[i]));
      worst = std::max(worst, ulpError(y[i], exact));
    }
    EXPECT_LE(worst, 2.0) << op;
  }
}

TEST(FastMathTest, DoubleArgumentsUseLibm) {
  for (double x : {-30.0, -1.5, -1e-9, 0.0, 0.3, 2.0, 700.0}) {
    EXPECT_EQ(cpu::fastExp(x), std::exp(x));
    EXPECT_EQ(cpu::fastTanh(x), std::tanh(x));
  }
}

}  // namespace
}  // namespace dgemma::test
