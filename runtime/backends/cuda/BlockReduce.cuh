// Block-wide reductions for the CUDA kernels (device code; include from .cu files only).
#pragma once

#include <cuda_runtime.h>

namespace dgemma::cuda {

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const { return a + b; }
};
struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

constexpr unsigned kFullWarpMask = 0xffffffffu;

// Butterfly reduction: every lane of the warp ends with the result. All 32 lanes must take part.
template <typename T, typename Op>
__device__ __forceinline__ T warpReduce(T value, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = op(value, __shfl_xor_sync(kFullWarpMask, value, offset));
  return value;
}

// Reduces one value (float or double) per thread over the block and returns the result to every thread. Requirements:
// blockDim.x is a multiple of 32 (so that every warp is full) and at most 1024, and every thread of
// the block calls it (it contains __syncthreads). Safe to call several times in a row.
template <typename T, typename Op>
__device__ T blockReduce(T value, Op op, T identity) {
  __shared__ T partial[32];
  __shared__ T result;
  const unsigned lane = threadIdx.x & 31u;
  const unsigned warp = threadIdx.x >> 5;
  const unsigned numWarps = blockDim.x >> 5;
  value = warpReduce(value, op);
  __syncthreads();  // every thread has read `result` of a previous call before it is overwritten
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    value = lane < numWarps ? partial[lane] : identity;
    value = warpReduce(value, op);
    if (lane == 0) result = value;
  }
  __syncthreads();
  return result;
}

}  // namespace dgemma::cuda
