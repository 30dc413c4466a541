// The CPU kernels' one call into BLAS: row-major C[m, n] = op(A) · op(B) + beta · C, op a transpose
// where asked, for f32 and f64. The matmul, MoE and attention kernels all multiply through it.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cstdint>

namespace dgemma::cpu {

// A leading dimension for BLAS, which wants at least 1 even where a zero-size dimension means that
// nothing is read (the attention contract admits Tk = 0 and D = 0).
inline int blasLeading(int64_t stride) { return static_cast<int>(std::max<int64_t>(1, stride)); }

inline void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                 const float* b, int64_t ldb, float* c, int64_t ldc, float beta = 0.0f) {
  cblas_sgemm(CblasRowMajor, transposeA ? CblasTrans : CblasNoTrans, transposeB ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, a, blasLeading(lda), b,
              blasLeading(ldb), beta, c, blasLeading(ldc));
}

inline void gemm(bool transposeA, bool transposeB, int64_t m, int64_t n, int64_t k, const double* a, int64_t lda,
                 const double* b, int64_t ldb, double* c, int64_t ldc, double beta = 0.0) {
  cblas_dgemm(CblasRowMajor, transposeA ? CblasTrans : CblasNoTrans, transposeB ? CblasTrans : CblasNoTrans,
              static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0, a, blasLeading(lda), b,
              blasLeading(ldb), beta, c, blasLeading(ldc));
}

}  // namespace dgemma::cpu
