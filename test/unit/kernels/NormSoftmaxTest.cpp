// rms_norm and softmax against the formulas evaluated in double.
#include <cmath>
#include <cstring>

#include "KernelTestSupport.h"
#include "runtime/kernels/FastMath.h"

namespace dgemma::test {
namespace {

std::vector<double> rmsNormReference(const std::vector<double>& x, int64_t width, double eps,
                                     const std::vector<double>* weight) {
  std::vector<double> y(x.size());
  for (size_t row = 0; row < x.size() / width; ++row) {
    double squares = 0;
    for (int64_t i = 0; i < width; ++i) squares += x[row * width + i] * x[row * width + i];
    const double scale = std::pow(squares / width + eps, -0.5);
    for (int64_t i = 0; i < width; ++i) y[row * width + i] = x[row * width + i] * scale * (weight ? (*weight)[i] : 1.0);
  }
  return y;
}

template <typename T>
void checkRmsNorm(DType dtype, std::vector<int64_t> shape, bool withWeight, ThreadPool* threads = nullptr) {
  const int64_t width = shape.back();
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  const double eps = 1e-5;
  const std::vector<T> x = randomValues<T>(count, 21, -3, 3);
  const std::vector<T> weight = randomValues<T>(width, 22, 0.5, 1.5);
  KernelCall call("rms_norm", {{"eps", eps}});
  call.input(dtype, shape, x);
  if (withWeight) call.input(dtype, {width}, weight);
  call.output(dtype, shape);
  call.run(threads);
  const std::vector<double> weight64(weight.begin(), weight.end());
  const std::vector<double> expected =
      rmsNormReference(std::vector<double>(x.begin(), x.end()), width, eps, withWeight ? &weight64 : nullptr);
  expectClose(call.result<T>(), expected, dtype == DType::F64 ? 1e-14 : 2e-6);
}

TEST(RmsNormKernel, WithoutWeight) {
  checkRmsNorm<float>(DType::F32, {4, 16}, false);
  checkRmsNorm<double>(DType::F64, {3, 2, 5}, false);
}

TEST(RmsNormKernel, WithWeight) {
  checkRmsNorm<float>(DType::F32, {4, 16}, true);
  checkRmsNorm<double>(DType::F64, {7, 9}, true);
}

TEST(RmsNormKernel, ManyRowsAcrossThreads) {
  ThreadPool threads(2);
  checkRmsNorm<float>(DType::F32, {257, 96}, true, &threads);
  checkRmsNorm<double>(DType::F64, {300, 64}, false, &threads);
}

TEST(RmsNormKernel, EpsDominatesAZeroRow) {
  KernelCall call("rms_norm", {{"eps", 0.25}});
  call.input<float>(DType::F32, {2, 2}, {0, 0, 3, 4}).output(DType::F32, {2, 2});
  call.run();
  // Row 0: 0 * (0 + 0.25)^-1/2 = 0. Row 1: mean(x^2) = 12.5, scale = 12.75^-1/2.
  const double scale = 1.0 / std::sqrt(12.75);
  expectClose(call.result<float>(), {0, 0, 3 * scale, 4 * scale}, 1e-7);
}

// rms_norm_backward against central differences of rmsNormReference: for the loss L = Σ dy·y,
// dx_i = ∂L/∂x_i and dw_j = ∂L/∂w_j, each from two evaluations of the forward in double.
template <typename T>
void checkRmsNormBackward(DType dtype, int64_t rows, int64_t width, bool withWeight, ThreadPool* threads = nullptr) {
  const double eps = 1e-5;
  const std::vector<T> x = randomValues<T>(rows * width, 41, -3, 3), dy = randomValues<T>(rows * width, 42);
  const std::vector<T> weight = randomValues<T>(width, 43, 0.5, 1.5);
  KernelCall call("rms_norm_backward", {{"eps", eps}});
  call.input(dtype, {rows, width}, x).input(dtype, {rows, width}, dy);
  if (withWeight) call.input(dtype, {width}, weight);
  call.output(dtype, {rows, width});
  if (withWeight) call.output(dtype, {width});
  call.run(threads);

  std::vector<double> x64(x.begin(), x.end()), weight64(weight.begin(), weight.end());
  auto loss = [&] {
    const std::vector<double> y = rmsNormReference(x64, width, eps, withWeight ? &weight64 : nullptr);
    double sum = 0;
    for (size_t i = 0; i < y.size(); ++i) sum += dy[i] * y[i];
    return sum;
  };
  auto derivative = [&](double& variable) {
    const double original = variable, step = 1e-6 * std::max(1.0, std::abs(original));
    variable = original + step;
    const double up = loss();
    variable = original - step;
    const double down = loss();
    variable = original;
    return (up - down) / (2 * step);
  };
  std::vector<double> dx(x64.size()), dw(weight64.size());
  for (size_t i = 0; i < x64.size(); ++i) dx[i] = derivative(x64[i]);
  const double tolerance = dtype == DType::F64 ? 1e-7 : 1e-5;
  expectClose(call.result<T>(0), dx, tolerance);
  if (!withWeight) return;
  for (size_t j = 0; j < weight64.size(); ++j) dw[j] = derivative(weight64[j]);
  expectClose(call.result<T>(1), dw, tolerance);
}

TEST(RmsNormBackwardKernel, MatchesCentralDifferences) {
  checkRmsNormBackward<double>(DType::F64, 5, 7, true);
  checkRmsNormBackward<double>(DType::F64, 3, 6, false);
  checkRmsNormBackward<float>(DType::F32, 4, 16, true);
  checkRmsNormBackward<float>(DType::F32, 4, 16, false);
}

TEST(RmsNormBackwardKernel, ManyRowsAndColumnBlocksAcrossThreads) {
  ThreadPool threads(2);
  checkRmsNormBackward<float>(DType::F32, 40, 37, true, &threads);  // 37 columns: a partial column block
}

// The row sums' lanes and dw's column blocks are fixed by the width alone: 1, 2 and 3 threads (and
// none) give the same bits, at widths that leave a partial lane group and a partial column block.
TEST(RmsNormBackwardKernel, ThreadCountChangesNoBit) {
  for (const int64_t width : {int64_t{256}, int64_t{300}, int64_t{37}}) {
    const int64_t rows = 70;
    const std::vector<float> x = randomValues<float>(rows * width, 51, -3, 3), dy = randomValues<float>(rows * width, 52);
    const std::vector<float> weight = randomValues<float>(width, 53, 0.5, 1.5);
    auto run = [&](ThreadPool* threads) {
      KernelCall call("rms_norm_backward", {{"eps", 1e-6}});
      call.input(DType::F32, {rows, width}, x).input(DType::F32, {rows, width}, dy).input(DType::F32, {width}, weight);
      call.output(DType::F32, {rows, width}).output(DType::F32, {width});
      call.run(threads);
      return std::make_pair(call.result<float>(0), call.result<float>(1));
    };
    const auto serial = run(nullptr);
    for (const int64_t count : {1, 2, 3}) {
      ThreadPool threads(count);
      const auto threaded = run(&threads);
      EXPECT_EQ(std::memcmp(threaded.first.data(), serial.first.data(), serial.first.size() * sizeof(float)), 0)
          << "dx, width " << width << ", " << count << " threads";
      EXPECT_EQ(std::memcmp(threaded.second.data(), serial.second.data(), serial.second.size() * sizeof(float)), 0)
          << "dw, width " << width << ", " << count << " threads";
    }
  }
}

// Softmax of x viewed as [outer, length, inner] along the middle dimension.
std::vector<double> softmaxReference(const std::vector<double>& x, int64_t outer, int64_t length, int64_t inner) {
  std::vector<double> y(x.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      auto index = [&](int64_t j) { return (o * length + j) * inner + i; };
      double sum = 0;
      for (int64_t j = 0; j < length; ++j) sum += std::exp(x[index(j)]);
      for (int64_t j = 0; j < length; ++j) y[index(j)] = std::exp(x[index(j)]) / sum;
    }
  return y;
}

template <typename T>
void checkSoftmax(DType dtype, const std::vector<int64_t>& shape, int64_t axis, ThreadPool* threads = nullptr) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t normalized = axis < 0 ? axis + rank : axis;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < normalized; ++d) outer *= shape[d];
  for (int64_t d = normalized + 1; d < rank; ++d) inner *= shape[d];
  const int64_t length = shape[normalized];
  const std::vector<T> x = randomValues<T>(outer * length * inner, 31, -5, 5);
  KernelCall call("softmax", {{"axis", axis}});
  call.input(dtype, shape, x).output(dtype, shape);
  call.run(threads);
  expectClose(call.result<T>(), softmaxReference(std::vector<double>(x.begin(), x.end()), outer, length, inner),
              dtype == DType::F64 ? 1e-15 : 1e-7);
}

TEST(SoftmaxKernel, LastAxis) {
  checkSoftmax<float>(DType::F32, {3, 10}, 1);
  checkSoftmax<double>(DType::F64, {2, 3, 7}, -1);
}

TEST(SoftmaxKernel, NonLastAxis) {
  checkSoftmax<double>(DType::F64, {2, 3, 4}, 1);
  checkSoftmax<float>(DType::F32, {5, 2, 3}, 0);
  checkSoftmax<float>(DType::F32, {2, 6, 3, 2}, -3);
}

TEST(SoftmaxKernel, ManyRowsAcrossThreads) {
  ThreadPool threads(2);
  checkSoftmax<float>(DType::F32, {400, 128}, -1, &threads);
  checkSoftmax<double>(DType::F64, {64, 50, 8}, 1, &threads);
}

TEST(SoftmaxKernel, LargeLogitsDoNotOverflow) {
  KernelCall call("softmax", {{"axis", 0}});
  call.input<float>(DType::F32, {3}, {1000.0f, 1000.0f, 999.0f}).output(DType::F32, {3});
  call.run();
  // exp(1000) overflows; the max-subtracted form sees 0, 0, -1.
  const double e = std::exp(-1.0);
  expectClose(call.result<float>(), {1 / (2 + e), 1 / (2 + e), e / (2 + e)}, 1e-7);
}

// The f32 last-axis kernel computes its exps in SIMD lanes, apart from their sum; the result must stay
// the one a single scalar loop gives (generation's self-conditioning softmax is pinned bit for bit):
// the same max, each exp of x − max, their running sum in index order, each exp divided by it.
TEST(SoftmaxKernel, LastAxisF32IsTheScalarLoopBitForBit) {
  ThreadPool threads(2);
  for (const int64_t length : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{16387}}) {
    const int64_t rows = 5;
    std::vector<float> x = randomValues<float>(static_cast<size_t>(rows * length), 31, -30, 30);
    x[0] = 30.0f;  // a tie with itself is the max; the exps of far-off entries underflow
    KernelCall call("softmax", {{"axis", -1}});
    call.input(DType::F32, {rows, length}, x).output(DType::F32, {rows, length});
    call.run(&threads);
    std::vector<float> expected(x.size());
    for (int64_t row = 0; row < rows; ++row) {
      const float* xRow = x.data() + row * length;
      float* yRow = expected.data() + row * length;
      float maximum = xRow[0];
      for (int64_t j = 1; j < length; ++j) maximum = std::max(maximum, xRow[j]);
      float sum = 0;
      for (int64_t j = 0; j < length; ++j) sum += (yRow[j] = cpu::fastExp(xRow[j] - maximum));
      for (int64_t j = 0; j < length; ++j) yRow[j] /= sum;
    }
    const std::vector<float> actual = call.result<float>();
    ASSERT_EQ(actual.size(), expected.size());
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(), expected.size() * sizeof(float)), 0) << "length " << length;
  }
}

}  // namespace
}  // namespace dgemma::test
