// matmul through OpenBLAS. OpenBLAS runs its own threads, so this kernel does not use the backend's
// pool: splitting batches across both would oversubscribe the cores.
#include <cblas.h>

#include <climits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

// Row-major C[m, n] = op(A) op(B) with op(A) [m, k] and op(B) [k, n].
void gemm(bool transposeA, bool transposeB, int m, int n, int k, const float* a, int lda, const float* b, int ldb,
          float* c, int ldc) {
  cblas_sgemm(CblasRowMajor, transposeA ? CblasTrans : CblasNoTrans, transposeB ? CblasTrans : CblasNoTrans, m, n, k,
              1.0f, a, lda, b, ldb, 0.0f, c, ldc);
}

void gemm(bool transposeA, bool transposeB, int m, int n, int k, const double* a, int lda, const double* b, int ldb,
          double* c, int ldc) {
  cblas_dgemm(CblasRowMajor, transposeA ? CblasTrans : CblasNoTrans, transposeB ? CblasTrans : CblasNoTrans, m, n, k,
              1.0, a, lda, b, ldb, 0.0, c, ldc);
}

struct MatmulDims {
  int64_t batch = 1;
  int64_t m = 0, n = 0, k = 0;
  bool transposeA = false, transposeB = false;
  bool sharedB = true;  // one b for every batch
};

template <typename T>
class MatmulKernel final : public Kernel {
 public:
  explicit MatmulKernel(MatmulDims dims) : dims_(dims) {}

  void run(ExecContext&, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* a = inputs[0].as<const T>();
    const T* b = inputs[1].as<const T>();
    T* c = outputs[0].as<T>();
    const MatmulDims& d = dims_;
    if (d.m == 0 || d.n == 0) return;
    if (d.k == 0) {  // an empty sum; BLAS rejects a leading dimension of 0
      std::fill(c, c + d.batch * d.m * d.n, T(0));
      return;
    }
    const int lda = static_cast<int>(d.transposeA ? d.m : d.k);
    const int ldb = static_cast<int>(d.transposeB ? d.k : d.n);
    const int n = static_cast<int>(d.n), k = static_cast<int>(d.k);
    // With one b and untransposed a, the batches are consecutive rows of a single [batch*m, k] matrix:
    // one large GEMM keeps OpenBLAS's threads busier than many small ones.
    if (d.sharedB && !d.transposeA && d.batch * d.m <= INT_MAX) {
      gemm(false, d.transposeB, static_cast<int>(d.batch * d.m), n, k, a, lda, b, ldb, c, n);
      return;
    }
    const int64_t strideB = d.sharedB ? 0 : d.k * d.n;
    for (int64_t i = 0; i < d.batch; ++i)
      gemm(d.transposeA, d.transposeB, static_cast<int>(d.m), n, k, a + i * d.m * d.k, lda, b + i * strideB, ldb,
           c + i * d.m * d.n, n);
  }

 private:
  MatmulDims dims_;
};

std::unique_ptr<Kernel> createMatmul(const KernelSignature& signature) {
  expectArity(signature, 2, 1);
  const Buffer& a = *signature.inputs[0];
  const Buffer& b = *signature.inputs[1];
  const Buffer& c = *signature.outputs[0];
  cpu::expectFloat(signature, a, "input a");
  expectDType(signature, b, {a.dtype}, "input b");
  expectDType(signature, c, {a.dtype}, "output c");
  MatmulDims dims;
  dims.transposeA = attrBool(signature, "transpose_a", false);
  dims.transposeB = attrBool(signature, "transpose_b", false);

  const size_t rank = a.shape.size();
  if (rank < 2) failSignature(signature, "input a has shape " + shapeToString(a.shape) + ", expected rank >= 2");
  const std::vector<int64_t> batchDims(a.shape.begin(), a.shape.end() - 2);
  dims.batch = numElementsOf(batchDims);
  dims.m = dims.transposeA ? a.shape[rank - 1] : a.shape[rank - 2];
  dims.k = dims.transposeA ? a.shape[rank - 2] : a.shape[rank - 1];

  dims.sharedB = b.shape.size() == 2;
  const bool batchedB = b.shape.size() == rank && std::equal(batchDims.begin(), batchDims.end(), b.shape.begin());
  if (!dims.sharedB && !batchedB)
    failSignature(signature, "input b has shape " + shapeToString(b.shape) + ", expected rank 2 or a's batch dims " +
                                 shapeToString(batchDims) + " followed by two dims");
  const size_t rankB = b.shape.size();
  const int64_t contractionB = dims.transposeB ? b.shape[rankB - 1] : b.shape[rankB - 2];
  dims.n = dims.transposeB ? b.shape[rankB - 2] : b.shape[rankB - 1];
  if (contractionB != dims.k)
    failSignature(signature, "contraction mismatch: a " + shapeToString(a.shape) + " has K=" + std::to_string(dims.k) +
                                 ", b " + shapeToString(b.shape) + " has K=" + std::to_string(contractionB));

  std::vector<int64_t> expected = batchDims;
  expected.push_back(dims.m);
  expected.push_back(dims.n);
  cpu::expectShape(signature, c, expected, "output c");
  if (dims.m > INT_MAX || dims.n > INT_MAX || dims.k > INT_MAX)
    failSignature(signature, "matrix dimensions exceed the BLAS integer range");

  if (a.dtype == DType::F64) return std::make_unique<MatmulKernel<double>>(dims);
  return std::make_unique<MatmulKernel<float>>(dims);
}

}  // namespace

void registerMatmulCpuKernels(KernelRegistry& registry) { registry.add("matmul", createMatmul); }

}  // namespace dgemma
