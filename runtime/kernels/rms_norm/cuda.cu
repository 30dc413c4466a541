// rms_norm on CUDA (f32): y = x * (mean(x^2) + eps)^(-1/2) [* w], over the last dim.
//
// One block per row (grid-stride over rows when there are more rows than blocks). Each thread
// accumulates the squares of the columns c = threadIdx.x + k * blockDim.x in f32, the block combines
// the partial sums with warp shuffles (blockReduce), and every thread then scales its own columns.
// 1/sqrt is IEEE division by the correctly rounded sqrtf (not the approximate rsqrtf), as on the CPU.
#include <cstdint>
#include <limits>

#include "runtime/backends/cuda/BlockReduce.cuh"
#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/rms_norm/Contract.h"

namespace dgemma {
namespace {

template <bool kHasWeight>
__global__ void rmsNormKernel(const float* x, const float* weight, float* y, int64_t rows, int cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xRow = x + row * cols;
    float* yRow = y + row * cols;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float v = xRow[c];
      sum += v * v;
    }
    sum = cuda::blockReduce(sum, cuda::SumOp{}, 0.0f);
    const float scale = 1.0f / sqrtf(sum / static_cast<float>(cols) + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float v = xRow[c] * scale;
      if constexpr (kHasWeight) v *= weight[c];
      yRow[c] = v;
    }
  }
}

class RmsNormCudaKernel final : public Kernel {
 public:
  RmsNormCudaKernel(int64_t rows, int cols, float eps, bool hasWeight)
      : rows_(rows), cols_(cols), eps_(eps), hasWeight_(hasWeight) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (rows_ == 0 || cols_ == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    // Whole warps only (blockReduce needs them); 32..512 threads, about one column per thread.
    unsigned threads = static_cast<unsigned>(cols_ >= 512 ? 512 : (cols_ + 31) / 32 * 32);
    unsigned blocks = cuda::gridFor(static_cast<uint64_t>(rows_), 1);
    const float* x = inputs[0].as<const float>();
    float* y = outputs[0].as<float>();
    if (hasWeight_) {
      rmsNormKernel<true><<<blocks, threads, 0, stream>>>(x, inputs[1].as<const float>(), y, rows_, cols_, eps_);
    } else {
      rmsNormKernel<false><<<blocks, threads, 0, stream>>>(x, nullptr, y, rows_, cols_, eps_);
    }
    DGEMMA_CUDA_CHECK_LAUNCH("rmsNormKernel");
  }

 private:
  int64_t rows_;
  int cols_;
  float eps_;
  bool hasWeight_;
};

std::unique_ptr<Kernel> createRmsNormKernel(const KernelSignature& signature) {
  const RmsNormContract contract = parseRmsNormContract(signature, {DType::F32});
  if (contract.width > std::numeric_limits<int>::max() - 1024)
    failSignature(signature, "rms_norm: last dimension " + std::to_string(contract.width) +
                                 " is too large for the cuda kernel");
  return std::make_unique<RmsNormCudaKernel>(contract.rows, static_cast<int>(contract.width),
                                             static_cast<float>(contract.eps), contract.weighted);
}

}  // namespace

void registerRmsNormCudaKernels(KernelRegistry& registry) { registry.add("rms_norm", createRmsNormKernel); }

}  // namespace dgemma
