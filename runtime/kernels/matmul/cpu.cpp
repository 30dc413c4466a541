// matmul through OpenBLAS. By default OpenBLAS runs its own threads, so this kernel does not use the
// backend's pool: splitting batches across both would oversubscribe the cores. When the products are
// threaded on the pool (BlasThreading.h), a large product is split into blocks of whole rows or
// columns of C, each one single-threaded OpenBLAS call, the same blocks whatever the pool's size.
#include <algorithm>
#include <climits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/matmul/BlasThreading.h"
#include "runtime/kernels/matmul/CpuGemm.h"
#include "runtime/kernels/matmul/Contract.h"

namespace dgemma {
namespace {

using cpu::gemm;

// Products of fewer multiply-adds run as one call: waking the pool would cost more than half of them.
constexpr int64_t kPooledMultiplyAdds = int64_t{1} << 21;
// A split product is at most this many OpenBLAS calls, each at least kMinimumBlockExtent rows or
// columns of C wide (a multiple of it). Each call packs the whole operand it does not split, so
// blocks of a fixed 64 re-packed the LM head's 256 × 256 activations 256 times in a [256, 16384]
// product; 16 blocks keep that small and still balance up to 16 threads.
constexpr int64_t kMaximumBlocks = 16;
constexpr int64_t kMinimumBlockExtent = 64;

// The rows or columns of C per call for a split of `extent` (a function of the shape alone).
int64_t blockExtent(int64_t extent) {
  const int64_t perBlock = (extent + kMaximumBlocks - 1) / kMaximumBlocks;
  return std::max(kMinimumBlockExtent, (perBlock + kMinimumBlockExtent - 1) / kMinimumBlockExtent * kMinimumBlockExtent);
}

// C = op(A) op(B), split into blocks spread over the pool when the products are threaded there and
// it is large. The split is along C's rows when op(B) is the smaller operand (each call packs all of
// it) and along its columns otherwise. The blocks depend on the shape alone, never on the pool's
// size: some of OpenBLAS's tile kernels (Haswell's) compute an element by where it sits in C, so a
// block's elements can differ in the last bits from one call over all of C, but every thread count
// gives the same bytes (test/unit/kernels/PooledProductsTest.cpp).
template <typename T>
void pooledGemm(ExecContext& context, bool transposeA, bool transposeB, int m, int n, int k, const T* a, int lda,
                const T* b, int ldb, T* c, int ldc) {
  const int64_t multiplyAdds = int64_t{m} * n * k;
  if (multiplyAdds < kPooledMultiplyAdds || !productsThreadedOnPool()) {
    gemm(transposeA, transposeB, m, n, k, a, lda, b, ldb, c, ldc);
    return;
  }
  const bool splitRows = n <= m;
  const int64_t extent = splitRows ? m : n, width = blockExtent(extent);
  const int64_t blocks = (extent + width - 1) / width;
  cpu::parallelFor(context, blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const int64_t first = block * width;
      const int count = static_cast<int>(std::min(first + width, extent) - first);
      if (splitRows)
        gemm(transposeA, transposeB, count, n, k, transposeA ? a + first : a + first * lda, lda, b, ldb, c + first * ldc,
             ldc);
      else
        gemm(transposeA, transposeB, m, count, k, a, lda, transposeB ? b + first * ldb : b + first, ldb, c + first, ldc);
    }
  });
}

template <typename T>
class MatmulKernel final : public Kernel {
 public:
  explicit MatmulKernel(MatmulContract dims) : dims_(dims) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* a = inputs[0].as<const T>();
    const T* b = inputs[1].as<const T>();
    T* c = outputs[0].as<T>();
    const MatmulContract& d = dims_;
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
      pooledGemm(context, false, d.transposeB, static_cast<int>(d.batch * d.m), n, k, a, lda, b, ldb, c, n);
      return;
    }
    const int64_t strideB = d.sharedB ? 0 : d.k * d.n;
    for (int64_t i = 0; i < d.batch; ++i)
      pooledGemm(context, d.transposeA, d.transposeB, static_cast<int>(d.m), n, k, a + i * d.m * d.k, lda,
                 b + i * strideB, ldb, c + i * d.m * d.n, n);
  }

 private:
  MatmulContract dims_;
};

std::unique_ptr<Kernel> createMatmulKernel(const KernelSignature& signature) {
  const MatmulContract contract = parseMatmulContract(signature, {DType::F32, DType::F64});
  if (contract.m > INT_MAX || contract.n > INT_MAX || contract.k > INT_MAX)
    failSignature(signature, "matrix dimensions exceed the BLAS integer range");
  if (contract.dtype == DType::F64) return std::make_unique<MatmulKernel<double>>(contract);
  return std::make_unique<MatmulKernel<float>>(contract);
}

}  // namespace

void registerMatmulCpuKernels(KernelRegistry& registry) { registry.add("matmul", createMatmulKernel); }

}  // namespace dgemma
