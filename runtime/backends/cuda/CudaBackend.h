// The CUDA backend: device memory through cudaMalloc, one cudaStream_t (and one cuBLAS handle) per
// plan stream, plan events as cudaEvents, kernels from registerCudaKernels(). This header is plain
// C++ (no CUDA headers), so code built without the CUDA toolkit's include path can create one.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "runtime/kernel_api/Backend.h"
#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// Creates the backend on device `deviceIndex` (0-based). Throws RuntimeError naming the reason when
// no device is usable ("cuda backend: no usable CUDA device: CUDA driver version is insufficient for
// CUDA runtime version"), when the index is out of range, or when this build's kernels have no image
// for the device's architecture. `hostThreads` (<= 0: one per core) run the kernels of a plan's host
// arena (--optimizer-offload; dgemma-run's --threads).
std::unique_ptr<Backend> createCudaBackend(int64_t deviceIndex, int64_t hostThreads = 0);

// The kernels the backend runs plans with: registerCudaKernels() with bf16 widened for the f32-only
// kernels (ReducedPrecision.h). Touches no device, so a machine without a GPU can check that a plan's
// every step has a CUDA kernel that accepts it (test/integration/CudaPlanTest.cpp).
KernelRegistry cudaBackendKernels();

// The kernels of a plan's host arena (--optimizer-offload; Backend::hostKernels()): the CPU's f32
// kernels, which run on the pinned host buffers. Touches no device either.
KernelRegistry cudaBackendHostKernels();

// True when the CUDA runtime reports at least one device. Otherwise false, and *reason (when given)
// says why (the CUDA error string, or "no CUDA device found"). Never throws.
bool cudaDeviceAvailable(std::string* reason);

}  // namespace dgemma
