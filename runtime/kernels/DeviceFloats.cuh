// Device helpers of the CUDA kernels that read and write f32 or bf16 buffers themselves (attention,
// cross_entropy; include from .cu files only): the element load and store, and the bounds assertions
// that the CMake option DGEMMA_CUDA_DEBUG_BOUNDS compiles in.
#pragma once

#include <cstdint>
#include <cstdio>

#include <cuda_runtime.h>

namespace dgemma::cuda {

// A bf16 buffer's elements are its raw 16-bit patterns (the high half of an f32).
__device__ __forceinline__ float loadFloat(const float* data, int64_t index) { return data[index]; }
__device__ __forceinline__ float loadFloat(const uint16_t* data, int64_t index) {
  return __uint_as_float(static_cast<uint32_t>(data[index]) << 16);
}

// Rounds once to the buffer's dtype: support/DType.h's f32ToBf16Bits on the device (round to nearest
// even, NaN quietened), which is what the CPU backend's widening applies to an f32 kernel's result.
__device__ __forceinline__ void storeFloat(float* data, int64_t index, float value) { data[index] = value; }
__device__ __forceinline__ void storeFloat(uint16_t* data, int64_t index, float value) {
  const uint32_t bits = __float_as_uint(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    data[index] = static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return;
  }
  data[index] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace dgemma::cuda

// DGEMMA_CUDA_BOUNDS(index, size): with -DDGEMMA_CUDA_DEBUG_BOUNDS=ON, a kernel that indexes outside
// [0, size) prints the place and traps (the launch's stream then reports cudaErrorLaunchFailure);
// otherwise nothing is compiled.
#if defined(DGEMMA_CUDA_DEBUG_BOUNDS)
#define DGEMMA_CUDA_BOUNDS(index, size)                                                              \
  do {                                                                                               \
    const long long dgemmaIndex_ = static_cast<long long>(index);                                    \
    const long long dgemmaSize_ = static_cast<long long>(size);                                      \
    if (dgemmaIndex_ < 0 || dgemmaIndex_ >= dgemmaSize_) {                                           \
      printf("%s:%d: index %lld of %s outside [0, %lld)\n", __FILE__, __LINE__, dgemmaIndex_, #index, \
             dgemmaSize_);                                                                           \
      __trap();                                                                                      \
    }                                                                                                \
  } while (0)
#else
#define DGEMMA_CUDA_BOUNDS(index, size) \
  do {                                  \
  } while (0)
#endif
