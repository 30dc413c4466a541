// DGEMMA_HOST_DEVICE marks the functions a CUDA kernel and the CPU code (kernels and their unit
// tests) share: __host__ __device__ under nvcc, nothing for the host compiler, so the headers that
// hold a kernel's per-element math are plain C++ outside CUDA.
#pragma once

#if defined(__CUDACC__)
#define DGEMMA_HOST_DEVICE __host__ __device__
#else
#define DGEMMA_HOST_DEVICE
#endif
