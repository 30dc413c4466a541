// The CUDA twins of the CPU kernels: each kernel folder's CUDA files (runtime/kernels/<folder>/cuda.cu,
// matmul/cuda.cpp, ...) register its kernels through one function declared here, one per line of
// KernelFolders.def, as the folder's cpu.cpp does for the CPU. The arithmetic kernels are f32 only
// except matmul, attention, cross-entropy, canvas_sample and fused_elementwise (f32 and bf16); their
// factories reject other dtypes when the plan is loaded, and the CUDA backend runs the f32-only ones
// on bf16 steps widened (runtime/backends/cuda/ReducedPrecision.h). The kernels that move bits
// (layout, cast, fill, copy, select, gather) take any dtype. Plain C++ header.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// Adds every folder's kernels.
void registerCudaKernels(KernelRegistry& registry);

#define DGEMMA_KERNEL_FOLDER(Name) void register##Name##CudaKernels(KernelRegistry& registry);
#include "runtime/kernels/KernelFolders.def"
#undef DGEMMA_KERNEL_FOLDER

// cudaSuccess (0) when this build's kernels have an image the current device can run; otherwise the
// cudaError_t value (e.g. cudaErrorNoKernelImageForDevice on a device of another architecture).
int probeCudaKernelImage();

}  // namespace dgemma
