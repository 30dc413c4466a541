// The elementwise folder's CUDA kernels span four files; registerElementwiseCudaKernels (cuda.cu, the
// twin of cpu.cpp's registration) adds the kernels of the other three through these. Plain C++ header.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

void registerCastCudaKernels(KernelRegistry& registry);    // cast.cu: cast
void registerFillCudaKernels(KernelRegistry& registry);    // fill.cu: fill
void registerSelectCudaKernels(KernelRegistry& registry);  // select.cu: select

}  // namespace dgemma
