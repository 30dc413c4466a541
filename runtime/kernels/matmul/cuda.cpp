// matmul on CUDA through cuBLAS: f32 here (cublasSgemm), bf16 a and b (c bf16 or f32) in
// matmul/cuda_bf16.cpp (cuBLASLt, f32 accumulation); the shapes and attributes are
// matmul/Contract.h's. The bf16 kernel reads and writes bf16 itself (KernelTraits::
// handlesReducedFloats), so the backend does not widen matmul.
//
// cuBLAS is column-major: a row-major X is, read column-major, X^T. So the row-major product
// C = op(A) op(B) is computed as the column-major product C^T = op(B)^T op(A)^T, i.e. cuBLAS's "A"
// operand is our b and its "B" operand is our a:
//   m = N, n = M, k = K, ldc = N,
//   b: no transpose -> CUBLAS_OP_N, ldb = N   (row-major [K, N] is column-major N x K)
//      transpose_b  -> CUBLAS_OP_T, ldb = K   (row-major [N, K] is column-major K x N)
//   a: no transpose -> CUBLAS_OP_N, lda = K   (row-major [M, K] is column-major K x M)
//      transpose_a  -> CUBLAS_OP_T, lda = M   (row-major [K, M] is column-major M x K)
// Batches: a shared b with untransposed a folds the batch into M (one sgemm over [batch*M, K]);
// otherwise one strided-batched sgemm (b's batch stride is 0 when b is shared).
// Each plan stream owns its cuBLAS handle (bound to the stream, CUBLAS_DEFAULT_MATH: no TF32).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/matmul/Contract.h"
#include "runtime/kernels/matmul/CudaBf16.h"

namespace dgemma {
namespace {

class MatmulCudaKernel final : public Kernel {
 public:
  explicit MatmulCudaKernel(MatmulContract shape) : s_(shape) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (s_.batch == 0 || s_.m == 0 || s_.n == 0) return;
    cuda::StreamState& state = cuda::streamState(context);
    const float* a = inputs[0].as<const float>();
    const float* b = inputs[1].as<const float>();
    float* c = outputs[0].as<float>();
    if (s_.k == 0) {  // empty contraction: c = 0 (do not rely on cuBLAS's k == 0 quick return)
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(c, 0, outputs[0].buffer->bytes(), state.stream));
      return;
    }
    const float one = 1.0f;
    const float zero = 0.0f;
    const cublasOperation_t opB = s_.transposeB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opA = s_.transposeA ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int n = static_cast<int>(s_.n);
    const int k = static_cast<int>(s_.k);
    const int ldb = static_cast<int>(s_.transposeB ? s_.k : s_.n);
    const int lda = static_cast<int>(s_.transposeA ? s_.m : s_.k);
    if (s_.batch == 1 || foldsBatch()) {
      const int rows = static_cast<int>(s_.batch * s_.m);
      DGEMMA_CUBLAS_CHECK(cublasSgemm(state.cublas, opB, opA, n, rows, k, &one, b, ldb, a, lda, &zero, c, n));
      return;
    }
    const long long strideA = s_.m * s_.k;
    const long long strideB = s_.sharedB ? 0 : s_.k * s_.n;
    const long long strideC = s_.m * s_.n;
    DGEMMA_CUBLAS_CHECK(cublasSgemmStridedBatched(state.cublas, opB, opA, n, static_cast<int>(s_.m), k, &one, b, ldb,
                                                  strideB, a, lda, strideA, &zero, c, n, strideC,
                                                  static_cast<int>(s_.batch)));
  }

  // A shared b and an untransposed a: the batches of a are consecutive rows of one [batch*M, K].
  bool foldsBatch() const {
    return s_.sharedB && !s_.transposeA && s_.batch * s_.m <= std::numeric_limits<int>::max();
  }

 private:
  MatmulContract s_;
};

std::unique_ptr<Kernel> createMatmulKernel(const KernelSignature& signature) {
  const MatmulContract contract = parseMatmulContract(signature, {DType::F32, DType::BF16}, /*f32OutputOfBf16=*/true);
  constexpr int64_t kIntMax = std::numeric_limits<int>::max();
  if (contract.m > kIntMax || contract.n > kIntMax || contract.k > kIntMax || contract.batch > kIntMax)
    failSignature(signature, "matmul: dimensions exceed the 32-bit limits of cuBLAS (batch " +
                                 std::to_string(contract.batch) + ", M " + std::to_string(contract.m) + ", N " +
                                 std::to_string(contract.n) + ", K " + std::to_string(contract.k) + ")");
  if (contract.dtype == DType::BF16) return createMatmulBf16CudaKernel(contract);
  return std::make_unique<MatmulCudaKernel>(contract);
}

}  // namespace

void registerMatmulCudaKernels(KernelRegistry& registry) {
  registry.add("matmul", createMatmulKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
