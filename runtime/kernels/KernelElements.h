// Element access for the CUDA kernels that read and write f32 or bf16 buffers themselves (attention,
// cross_entropy), usable on the device and on the host: the kernels' bodies are __host__ __device__
// templates that the CPU unit tests run on the host (one thread per block), so the loads, the
// rounding stores and the bounds assertions are too. Also the bounds assertions that the CMake option
// DGEMMA_CUDA_DEBUG_BOUNDS compiles in.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::kernels {

DGEMMA_HOST_DEVICE inline float floatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

DGEMMA_HOST_DEVICE inline uint32_t bitsOfFloat(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

// A bf16 buffer's elements are its raw 16-bit patterns (the high half of an f32).
DGEMMA_HOST_DEVICE inline float loadFloat(const float* data, int64_t index) { return data[index]; }
DGEMMA_HOST_DEVICE inline float loadFloat(const uint16_t* data, int64_t index) {
  return floatFromBits(static_cast<uint32_t>(data[index]) << 16);
}

// Rounds once to the buffer's dtype: support/DType.h's f32ToBf16Bits (round to nearest even, NaN
// quietened), which is what the CPU backend's widening applies to an f32 kernel's result.
DGEMMA_HOST_DEVICE inline void storeFloat(float* data, int64_t index, float value) { data[index] = value; }
DGEMMA_HOST_DEVICE inline void storeFloat(uint16_t* data, int64_t index, float value) {
  const uint32_t bits = bitsOfFloat(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    data[index] = static_cast<uint16_t>((bits >> 16) | 0x0040u);
    return;
  }
  data[index] = static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
}

DGEMMA_HOST_DEVICE inline int64_t smaller(int64_t a, int64_t b) { return a < b ? a : b; }

// Reports an index outside its tensor and stops: a trap on the device (the stream then reports
// cudaErrorLaunchFailure), abort on the host.
DGEMMA_HOST_DEVICE inline void failBounds(const char* file, int line, const char* what, long long index, long long size) {
  printf("%s:%d: index %lld of %s outside [0, %lld)\n", file, line, index, what, size);
#if defined(__CUDA_ARCH__)
  __trap();
#else
  std::abort();
#endif
}

// The running thread of a CUDA block as the kernels' host-device bodies see it: under nvcc on the
// device threadIdx.x of blockDim.x, on the host one thread. A kernel's block type adds its barrier
// or reductions to it.
struct CudaThreadIndex {
  DGEMMA_HOST_DEVICE int thread() const {
#if defined(__CUDA_ARCH__)
    return static_cast<int>(threadIdx.x);
#else
    return 0;
#endif
  }
  DGEMMA_HOST_DEVICE int threads() const {
#if defined(__CUDA_ARCH__)
    return static_cast<int>(blockDim.x);
#else
    return 1;
#endif
  }
};

}  // namespace dgemma::kernels

// DGEMMA_CUDA_BOUNDS(index, size): with -DDGEMMA_CUDA_DEBUG_BOUNDS=ON an index outside [0, size)
// stops the kernel (see failBounds); otherwise nothing is compiled.
#if defined(DGEMMA_CUDA_DEBUG_BOUNDS)
#define DGEMMA_CUDA_BOUNDS(index, size)                                                                     \
  do {                                                                                                      \
    const long long dgemmaIndex_ = static_cast<long long>(index);                                           \
    const long long dgemmaSize_ = static_cast<long long>(size);                                             \
    if (dgemmaIndex_ < 0 || dgemmaIndex_ >= dgemmaSize_)                                                    \
      ::dgemma::kernels::failBounds(__FILE__, __LINE__, #index, dgemmaIndex_, dgemmaSize_);                 \
  } while (0)
#else
#define DGEMMA_CUDA_BOUNDS(index, size) \
  do {                                  \
  } while (0)
#endif
