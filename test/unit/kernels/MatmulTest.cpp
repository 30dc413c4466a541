// matmul against a triple loop in double: transposes, shared and batched right-hand sides, f32 and f64.
#include "KernelTestSupport.h"

namespace dgemma::test {
namespace {

struct MatmulCase {
  std::vector<int64_t> batch;  // leading dims of a (and of b when batchedB)
  int64_t m, k, n;
  bool transposeA = false, transposeB = false, batchedB = false;
};

template <typename T>
void checkMatmul(const MatmulCase& c, DType dtype) {
  int64_t batch = 1;
  for (int64_t dim : c.batch) batch *= dim;
  std::vector<int64_t> aShape = c.batch, bShape = c.batchedB ? c.batch : std::vector<int64_t>{}, cShape = c.batch;
  aShape.push_back(c.transposeA ? c.k : c.m);
  aShape.push_back(c.transposeA ? c.m : c.k);
  bShape.push_back(c.transposeB ? c.n : c.k);
  bShape.push_back(c.transposeB ? c.k : c.n);
  cShape.push_back(c.m);
  cShape.push_back(c.n);
  const int64_t bBatches = c.batchedB ? batch : 1;
  const std::vector<T> a = randomValues<T>(batch * c.m * c.k, 11);
  const std::vector<T> b = randomValues<T>(bBatches * c.k * c.n, 12);

  KernelCall call("matmul", {{"transpose_a", c.transposeA}, {"transpose_b", c.transposeB}});
  call.input(dtype, aShape, a).input(dtype, bShape, b).output(dtype, cShape);
  call.run();

  const std::vector<double> a64(a.begin(), a.end()), b64(b.begin(), b.end());
  std::vector<double> expected(batch * c.m * c.n);
  for (int64_t p = 0; p < batch; ++p) {
    const int64_t aOffset = p * c.m * c.k, bOffset = c.batchedB ? p * c.k * c.n : 0;
    for (int64_t i = 0; i < c.m; ++i)
      for (int64_t j = 0; j < c.n; ++j) {
        double sum = 0;
        // a is stored [m, k], or [k, m] when transposed; b is stored [k, n], or [n, k].
        for (int64_t l = 0; l < c.k; ++l)
          sum += (c.transposeA ? a64[aOffset + l * c.m + i] : a64[aOffset + i * c.k + l]) *
                 (c.transposeB ? b64[bOffset + j * c.k + l] : b64[bOffset + l * c.n + j]);
        expected[(p * c.m + i) * c.n + j] = sum;
      }
  }
  expectClose(call.result<T>(), expected, dtype == DType::F64 ? 1e-13 : 1e-5);
}

TEST(MatmulKernel, PlainF32AndF64) {
  checkMatmul<float>({{}, 5, 7, 3}, DType::F32);
  checkMatmul<double>({{}, 33, 65, 17}, DType::F64);
}

TEST(MatmulKernel, EveryTransposeCombination) {
  for (bool transposeA : {false, true})
    for (bool transposeB : {false, true}) {
      SCOPED_TRACE(::testing::Message() << "transpose_a=" << transposeA << " transpose_b=" << transposeB);
      checkMatmul<float>({{}, 4, 6, 5, transposeA, transposeB}, DType::F32);
      checkMatmul<double>({{2}, 3, 7, 2, transposeA, transposeB}, DType::F64);
    }
}

TEST(MatmulKernel, BatchedWithSharedRhs) {
  checkMatmul<float>({{2, 3}, 4, 5, 6}, DType::F32);                // batches folded into one GEMM
  checkMatmul<double>({{2, 3}, 4, 5, 6, true, false}, DType::F64);  // transposed a: one GEMM per batch
  checkMatmul<float>({{3}, 4, 5, 6, false, true}, DType::F32);
}

TEST(MatmulKernel, BatchedWithBatchedRhs) {
  checkMatmul<float>({{3}, 4, 5, 2, false, false, true}, DType::F32);
  checkMatmul<double>({{2, 2}, 3, 4, 5, true, true, true}, DType::F64);
}

TEST(MatmulKernel, EmptyContractionGivesZeros) {
  KernelCall call("matmul", {{"transpose_a", false}, {"transpose_b", false}});
  call.input<float>(DType::F32, {2, 0}, {}).input<float>(DType::F32, {0, 3}, {}).output(DType::F32, {2, 3});
  call.run();
  EXPECT_EQ(call.result<float>(), std::vector<float>(6, 0.0f));
}

}  // namespace
}  // namespace dgemma::test
