// softmax on CUDA (f32), along the last axis only (other axes are rejected when the plan is loaded):
// y = exp(x - max(x)) / sum(exp(x - max(x))) per row.
//
// One block per row (grid-stride over rows when there are more rows than blocks), three passes over
// the row: the max (block reduction with warp shuffles), then exp(x - max) written to y while summing
// (second block reduction), then y /= sum. Each thread touches the same columns in every pass, so
// the in-place case (y == x) is safe. expf is the accurate libdevice expf (no fast math).
#include <cmath>
#include <cstdint>
#include <limits>

#include "runtime/backends/cuda/BlockReduce.cuh"
#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/softmax/Contract.h"
#include "support/Shape.h"

namespace dgemma {
namespace {

__global__ void softmaxLastAxisKernel(const float* x, float* y, int64_t rows, int cols) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xRow = x + row * cols;
    float* yRow = y + row * cols;
    float maximum = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(row * cols + c, rows * cols);
      maximum = fmaxf(maximum, xRow[c]);
    }
    maximum = cuda::blockReduce(maximum, cuda::MaxOp{}, -INFINITY);
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(row * cols + c, rows * cols);
      float e = expf(xRow[c] - maximum);
      yRow[c] = e;
      sum += e;
    }
    sum = cuda::blockReduce(sum, cuda::SumOp{}, 0.0f);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) yRow[c] = yRow[c] / sum;
  }
}

class SoftmaxCudaKernel final : public Kernel {
 public:
  SoftmaxCudaKernel(int64_t rows, int cols) : rows_(rows), cols_(cols) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (rows_ == 0 || cols_ == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    unsigned threads = static_cast<unsigned>(cols_ >= 512 ? 512 : (cols_ + 31) / 32 * 32);
    unsigned blocks = cuda::gridFor(static_cast<uint64_t>(rows_), 1);
    softmaxLastAxisKernel<<<blocks, threads, 0, stream>>>(inputs[0].as<const float>(), outputs[0].as<float>(), rows_,
                                                         cols_);
    DGEMMA_CUDA_CHECK_LAUNCH("softmaxLastAxisKernel");
  }

 private:
  int64_t rows_;
  int cols_;
};

std::unique_ptr<Kernel> createSoftmaxKernel(const KernelSignature& signature) {
  const SoftmaxContract contract = parseSoftmaxContract(signature, {DType::F32});
  if (contract.axis != contract.rank - 1)
    failSignature(signature, "softmax: the cuda backend implements softmax along the last axis only (axis " +
                                 std::to_string(contract.requestedAxis) + " of x " +
                                 shapeToString(signature.inputs[0]->shape) +
                                 "; the compiler should transpose the axis last)");
  const int64_t cols = contract.length;
  if (cols > std::numeric_limits<int>::max() - 1024)
    failSignature(signature, "softmax: last dimension " + std::to_string(cols) + " is too large for the cuda kernel");
  const int64_t rows = cols == 0 ? 0 : contract.outer;
  return std::make_unique<SoftmaxCudaKernel>(rows, static_cast<int>(cols));
}

}  // namespace

void registerSoftmaxCudaKernels(KernelRegistry& registry) { registry.add("softmax", createSoftmaxKernel); }

}  // namespace dgemma
