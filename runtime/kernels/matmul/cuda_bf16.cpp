// matmul on CUDA for bf16 through cuBLASLt: a and b in bf16 (CUDA_R_16BF), products accumulated in
// f32 (CUBLAS_COMPUTE_32F, f32 alpha = 1 and beta = 0), each element of c rounded once to bf16, to
// nearest even, or written as it is when c is f32 (the plans' f32 results of bf16 products). That is
// the CPU backend's bf16 matmul (runtime/backends/cpu/ReducedPrecision.h: a and b widened exactly to
// f32, an f32 sgemm, a bf16 c rounded once): a bf16 product is exact in f32, so the two differ only in
// the order (and, on tensor cores, the rounding) of the f32 sums, which may move a result across a
// bf16 rounding boundary. docs/kernels.md ("CUDA twins") gives the tolerance the GPU test holds it to.
//
// The operands map as in matmul/cuda.cpp (cuBLASLt is column-major too): cuBLASLt's A is our b, its
// B our a, its C and D our c, each layout describing the stored matrix (before its transpose):
//   b: rows N, cols K, ld N; transpose_b: rows K, cols N, ld K; then TRANSA = T
//   a: rows K, cols M, ld K; transpose_a: rows M, cols K, ld M; then TRANSB = T
//   c: rows N, cols M, ld N
// Batches: a shared b with untransposed a folds the batch into M (one product over [batch*M, K]);
// otherwise a strided batch of the layouts (b's batch stride 0 when b is shared).
//
// The algorithm is cublasLtMatmulAlgoGetHeuristic's first choice for the stream's cuBLASLt handle
// and the alignment of the buffers the step runs on, found at the first run and again only when
// either changes; its workspace (at most kMaxWorkspaceBytes) is allocated in stream order for each run.
#include "runtime/kernels/matmul/CudaBf16.h"

#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "support/DType.h"
#include "support/Error.h"

namespace dgemma {
namespace {

// cuBLAS's recommended workspace for Hopper.
constexpr uint64_t kMaxWorkspaceBytes = uint64_t{32} << 20;
// cuBLASLt's default alignment assumption for its heuristic.
constexpr uint32_t kFullAlignmentBytes = 256;

template <typename Handle, cublasStatus_t (*destroy)(Handle)>
struct LtDeleter {
  void operator()(Handle handle) const { destroy(handle); }
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>,
                                   LtDeleter<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>>;
using MatrixLayout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>,
                                     LtDeleter<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>>;
using MatmulPreference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                                         LtDeleter<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>>;

// A column-major matrix of `type` of `rows` x `cols` (leading dimension `ld`), `batch` of them
// `stride` elements apart.
MatrixLayout layoutOf(cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld, int32_t batch, int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  DGEMMA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&layout, type, rows, cols, ld));
  MatrixLayout owned(layout);
  if (batch > 1) {
    DGEMMA_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)));
    DGEMMA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                         &stride, sizeof(stride)));
  }
  return owned;
}

// The largest power of two (at most kFullAlignmentBytes) dividing the address of every batch's matrix.
uint32_t alignmentBytes(const void* base, int64_t strideElements, uint64_t elementBytes) {
  uint64_t bits = reinterpret_cast<uintptr_t>(base) | kFullAlignmentBytes;
  if (strideElements > 0) bits |= static_cast<uint64_t>(strideElements) * elementBytes;
  return static_cast<uint32_t>(bits & (~bits + 1));
}

class MatmulBf16CudaKernel final : public Kernel {
 public:
  explicit MatmulBf16CudaKernel(MatmulContract shape) : s_(shape) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (s_.batch == 0 || s_.m == 0 || s_.n == 0) return;
    cuda::StreamState& state = cuda::streamState(context);
    const void* a = inputs[0].data;
    const void* b = inputs[1].data;
    void* c = outputs[0].data;
    if (s_.k == 0) {  // empty contraction: c = 0 (do not rely on cuBLASLt for k == 0)
      DGEMMA_CUDA_CHECK(cudaMemsetAsync(c, 0, outputs[0].buffer->bytes(), state.stream));
      return;
    }
    const Alignments alignments{alignmentBytes(a, folded() ? 0 : strideA(), sizeof(uint16_t)),
                                alignmentBytes(b, strideB(), sizeof(uint16_t)),
                                alignmentBytes(c, folded() ? 0 : strideC(), dtypeSize(s_.outputDType))};
    std::lock_guard<std::mutex> lock(mutex_);
    if (descriptors_.matmul == nullptr) describe();
    if (state.cublasLt != algoHandle_ || alignments != algoAlignments_) chooseAlgo(state.cublasLt, alignments);
    void* workspace = nullptr;
    if (workspaceBytes_ > 0) DGEMMA_CUDA_CHECK(cudaMallocAsync(&workspace, workspaceBytes_, state.stream));
    // Freed in stream order also when the product throws.
    struct Release {
      void* workspace;
      cudaStream_t stream;
      ~Release() {
        if (workspace != nullptr) cudaFreeAsync(workspace, stream);
      }
    } release{workspace, state.stream};
    const float one = 1.0f;
    const float zero = 0.0f;
    DGEMMA_CUBLAS_CHECK(cublasLtMatmul(state.cublasLt, descriptors_.matmul.get(), &one, b, descriptors_.b.get(), a,
                                       descriptors_.a.get(), &zero, c, descriptors_.c.get(), c, descriptors_.c.get(),
                                       &algo_, workspace, workspaceBytes_, state.stream));
  }

 private:
  struct Alignments {
    uint32_t a = 0, b = 0, c = 0;
    bool operator!=(const Alignments& other) const { return a != other.a || b != other.b || c != other.c; }
  };
  struct Descriptors {
    MatmulDesc matmul;
    MatrixLayout a, b, c;
  };

  // A shared b and an untransposed a: the batches of a are consecutive rows of one [batch*M, K].
  bool folded() const {
    return s_.batch == 1 || (s_.sharedB && !s_.transposeA && s_.batch * s_.m <= std::numeric_limits<int>::max());
  }
  int64_t strideA() const { return s_.m * s_.k; }
  int64_t strideB() const { return s_.sharedB ? 0 : s_.k * s_.n; }
  int64_t strideC() const { return s_.m * s_.n; }

  // The descriptors depend on the shape only; built at the first run rather than at plan load, so
  // that loading a plan touches no CUDA library.
  void describe() {
    cublasLtMatmulDesc_t matmul = nullptr;
    DGEMMA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&matmul, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    descriptors_.matmul.reset(matmul);
    const cublasOperation_t opB = s_.transposeB ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t opA = s_.transposeA ? CUBLAS_OP_T : CUBLAS_OP_N;
    DGEMMA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_TRANSA, &opB, sizeof(opB)));
    DGEMMA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(matmul, CUBLASLT_MATMUL_DESC_TRANSB, &opA, sizeof(opA)));
    const int32_t batch = folded() ? 1 : static_cast<int32_t>(s_.batch);
    const uint64_t rows = static_cast<uint64_t>(folded() ? s_.batch * s_.m : s_.m);
    const uint64_t m = static_cast<uint64_t>(s_.m), n = static_cast<uint64_t>(s_.n), k = static_cast<uint64_t>(s_.k);
    const cudaDataType_t bf16 = CUDA_R_16BF;
    descriptors_.b = s_.transposeB ? layoutOf(bf16, k, n, s_.k, batch, strideB()) : layoutOf(bf16, n, k, s_.n, batch, strideB());
    descriptors_.a =
        s_.transposeA ? layoutOf(bf16, m, k, s_.m, batch, strideA()) : layoutOf(bf16, k, rows, s_.k, batch, strideA());
    const cudaDataType_t cType = s_.outputDType == DType::F32 ? CUDA_R_32F : CUDA_R_16BF;
    descriptors_.c = layoutOf(cType, n, rows, s_.n, batch, strideC());
  }

  void chooseAlgo(cublasLtHandle_t handle, const Alignments& alignments) {
    cublasLtMatmulPreference_t preference = nullptr;
    DGEMMA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
    MatmulPreference owned(preference);
    const uint64_t maxWorkspace = kMaxWorkspaceBytes;
    DGEMMA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &maxWorkspace, sizeof(maxWorkspace)));
    // cuBLASLt's A is our b and its B our a; C and D are both c.
    for (const auto& [attribute, bytes] :
         {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignments.b},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignments.a},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignments.c},
          std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignments.c}})
      DGEMMA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(preference, attribute, &bytes, sizeof(bytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    DGEMMA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, descriptors_.matmul.get(), descriptors_.b.get(),
                                                       descriptors_.a.get(), descriptors_.c.get(), descriptors_.c.get(),
                                                       preference, 1, &result, &found));
    if (found == 0)
      throw RuntimeError("cuda backend: matmul bf16 -> " + std::string(dtypeName(s_.outputDType)) +
                         ": cuBLASLt has no algorithm for batch " + std::to_string(s_.batch) +
                         ", M " + std::to_string(s_.m) + ", N " + std::to_string(s_.n) + ", K " +
                         std::to_string(s_.k) + (s_.transposeA ? ", transpose_a" : "") +
                         (s_.transposeB ? ", transpose_b" : "") + (s_.sharedB ? ", shared b" : ""));
    algo_ = result.algo;
    workspaceBytes_ = result.workspaceSize;
    algoHandle_ = handle;
    algoAlignments_ = alignments;
  }

  MatmulContract s_;
  std::mutex mutex_;  // the cached descriptors and algorithm
  Descriptors descriptors_;
  cublasLtHandle_t algoHandle_ = nullptr;  // what algo_ was chosen for
  Alignments algoAlignments_;
  cublasLtMatmulAlgo_t algo_{};
  size_t workspaceBytes_ = 0;
};

}  // namespace

std::unique_ptr<Kernel> createMatmulBf16CudaKernel(const MatmulContract& contract) {
  return std::make_unique<MatmulBf16CudaKernel>(contract);
}

}  // namespace dgemma
