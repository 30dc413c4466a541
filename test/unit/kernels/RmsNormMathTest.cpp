// runtime/kernels/rms_norm/RmsNormMath.h, the arithmetic of the CUDA rms_norm_backward, on the host
// against the CPU kernel: with each row's sums taken in the CPU kernel's order (eight partial sums,
// column c in lane c mod 8, the lanes added in order; docs/kernels.md) dx and dw equal the CPU
// kernel's bit for bit, with and without a weight.
#include "KernelTestSupport.h"
#include "runtime/kernels/rms_norm/RmsNormMath.h"

namespace dgemma::test {
namespace {

TEST(RmsNormMath, BackwardMatchesCpuKernel) {
  for (const bool weighted : {true, false}) {
    for (const auto& [rows, width] :
         std::vector<std::pair<int64_t, int64_t>>{{7, 33}, {3, 256}, {1, 1}, {12, 5}, {5, 300}, {2, 2817}}) {
      const double eps = 1e-6;
      const std::vector<float> x = randomValues<float>(rows * width, 11 + static_cast<uint32_t>(width));
      const std::vector<float> dy = randomValues<float>(rows * width, 12 + static_cast<uint32_t>(width));
      const std::vector<float> w = randomValues<float>(width, 13, 0.5, 1.5);
      KernelCall call("rms_norm_backward", {{"eps", eps}});
      call.input(DType::F32, {rows, width}, x).input(DType::F32, {rows, width}, dy);
      if (weighted) call.input(DType::F32, {width}, w);
      call.output(DType::F32, {rows, width});
      if (weighted) call.output(DType::F32, {width});
      call.run();
      const std::vector<float> dx = call.result<float>(0);

      const float* weight = weighted ? w.data() : nullptr;
      std::vector<double> rowR(rows);
      for (int64_t row = 0; row < rows; ++row) {
        double squares[8] = {}, projections[8] = {};
        for (int64_t c = 0; c < width; ++c) {
          const double xValue = x[row * width + c];
          squares[c % 8] += xValue * xValue;
          projections[c % 8] += rms_norm::gradientOf(dy.data(), weight, row * width + c, c) * xValue;
        }
        double sumOfSquares = 0, projection = 0;
        for (int lane = 0; lane < 8; ++lane) {
          sumOfSquares += squares[lane];
          projection += projections[lane];
        }
        const rms_norm::RowScales scales = rms_norm::rowScales(sumOfSquares, projection, width, eps);
        rowR[row] = scales.r;
        for (int64_t c = 0; c < width; ++c) {
          const float expected = static_cast<float>(rms_norm::inputGradient(
              scales, rms_norm::gradientOf(dy.data(), weight, row * width + c, c), x[row * width + c]));
          ASSERT_EQ(dx[row * width + c], expected) << "dx row " << row << " column " << c << " of " << width;
        }
      }
      if (!weighted) continue;
      const std::vector<float> dw = call.result<float>(1);
      for (int64_t c = 0; c < width; ++c)
        ASSERT_EQ(dw[c], static_cast<float>(rms_norm::weightGradient(x.data(), dy.data(), rowR.data(), rows, width, c)))
            << "dw column " << c << " of " << width;
    }
  }
}

}  // namespace
}  // namespace dgemma::test
