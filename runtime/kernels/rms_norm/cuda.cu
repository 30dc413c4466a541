// rms_norm on CUDA (f32): y = x * (mean(x^2) + eps)^(-1/2) [* w], over the last dim; and
// rms_norm_backward (f32), its gradients with the row sums and dw in f64 (RmsNormMath.h).
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
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/rms_norm/Contract.h"
#include "runtime/kernels/rms_norm/RmsNormMath.h"

namespace dgemma {
namespace {

template <bool kHasWeight>
__global__ void rmsNormKernel(const float* x, const float* weight, float* y, int64_t rows, int cols, float eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const float* xRow = x + row * cols;
    float* yRow = y + row * cols;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(row * cols + c, rows * cols);
      float v = xRow[c];
      sum += v * v;
    }
    sum = cuda::blockReduce(sum, cuda::SumOp{}, 0.0f);
    const float scale = 1.0f / sqrtf(sum / static_cast<float>(cols) + eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(row * cols + c, rows * cols);
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

// A block per row (grid-stride): the row's two f64 sums as a tree over the block, then each thread
// writes dx for its columns; thread 0 keeps the row's r for dw.
__global__ void rmsNormBackwardRowsKernel(const float* x, const float* dy, const float* weight, float* dx, double* rowR,
                                          int64_t rows, int cols, double eps) {
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const int64_t first = row * cols;
    double sumOfSquares = 0, projection = 0;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(first + c, rows * cols);
      const double xValue = x[first + c];
      sumOfSquares += xValue * xValue;
      projection += rms_norm::gradientOf(dy, weight, first + c, c) * xValue;
    }
    sumOfSquares = cuda::blockReduce(sumOfSquares, cuda::SumOp{}, 0.0);
    projection = cuda::blockReduce(projection, cuda::SumOp{}, 0.0);
    const rms_norm::RowScales scales = rms_norm::rowScales(sumOfSquares, projection, cols, eps);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      DGEMMA_CUDA_BOUNDS(first + c, rows * cols);
      dx[first + c] = static_cast<float>(
          rms_norm::inputGradient(scales, rms_norm::gradientOf(dy, weight, first + c, c), x[first + c]));
    }
    if (threadIdx.x == 0) rowR[row] = scales.r;
  }
}

// A thread per column: dw sums the rows in order, as the CPU kernel does.
__global__ void rmsNormWeightGradientKernel(const float* x, const float* dy, const double* rowR, float* dw, int64_t rows,
                                            int cols) {
  for (int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dw[c] = static_cast<float>(rms_norm::weightGradient(x, dy, rowR, rows, cols, c));
}

class RmsNormBackwardCudaKernel final : public Kernel {
 public:
  RmsNormBackwardCudaKernel(int64_t rows, int cols, double eps, bool weighted)
      : rows_(rows), cols_(cols), eps_(eps), weighted_(weighted) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cudaStream_t stream = cuda::streamState(context).stream;
    const float* weight = weighted_ ? inputs[2].as<const float>() : nullptr;
    if (rows_ == 0 || cols_ == 0) {
      // No rows: dw is an empty sum.
      if (weighted_ && cols_ > 0) DGEMMA_CUDA_CHECK(cudaMemsetAsync(outputs[1].data, 0, cols_ * sizeof(float), stream));
      return;
    }
    double* rowR = nullptr;
    DGEMMA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&rowR), rows_ * sizeof(double), stream));
    const unsigned threads = static_cast<unsigned>(cols_ >= 512 ? 512 : (cols_ + 31) / 32 * 32);
    rmsNormBackwardRowsKernel<<<cuda::gridFor(static_cast<uint64_t>(rows_), 1), threads, 0, stream>>>(
        inputs[0].as<const float>(), inputs[1].as<const float>(), weight, outputs[0].as<float>(), rowR, rows_, cols_, eps_);
    cudaError_t launched = cudaGetLastError();
    if (launched == cudaSuccess && weighted_) {
      constexpr unsigned kColumnThreads = 256;
      rmsNormWeightGradientKernel<<<cuda::gridFor(static_cast<uint64_t>(cols_), kColumnThreads), kColumnThreads, 0,
                                    stream>>>(inputs[0].as<const float>(), inputs[1].as<const float>(), rowR,
                                              outputs[1].as<float>(), rows_, cols_);
      launched = cudaGetLastError();
    }
    DGEMMA_CUDA_CHECK(cudaFreeAsync(rowR, stream));
    if (launched != cudaSuccess) cuda::throwCudaError(launched, "launch of rmsNormBackward", __FILE__, __LINE__);
  }

 private:
  int64_t rows_;
  int cols_;
  double eps_;
  bool weighted_;
};

std::unique_ptr<Kernel> createRmsNormKernel(const KernelSignature& signature) {
  const RmsNormContract contract = parseRmsNormContract(signature, {DType::F32});
  if (contract.width > std::numeric_limits<int>::max() - 1024)
    failSignature(signature, "rms_norm: last dimension " + std::to_string(contract.width) +
                                 " is too large for the cuda kernel");
  return std::make_unique<RmsNormCudaKernel>(contract.rows, static_cast<int>(contract.width),
                                             static_cast<float>(contract.eps), contract.weighted);
}

std::unique_ptr<Kernel> createRmsNormBackwardKernel(const KernelSignature& signature) {
  const RmsNormContract contract = parseRmsNormBackwardContract(signature, {DType::F32});
  if (contract.width > std::numeric_limits<int>::max() - 1024)
    failSignature(signature, "rms_norm_backward: last dimension " + std::to_string(contract.width) +
                                 " is too large for the cuda kernel");
  return std::make_unique<RmsNormBackwardCudaKernel>(contract.rows, static_cast<int>(contract.width), contract.eps,
                                                     contract.weighted);
}

}  // namespace

void registerRmsNormCudaKernels(KernelRegistry& registry) {
  registry.add("rms_norm", createRmsNormKernel);
  registry.add("rms_norm_backward", createRmsNormBackwardKernel);
}

}  // namespace dgemma
