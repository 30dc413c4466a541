// The CPU backend's kernels: every kernel of docs/kernels.md (collectives are not kernels). Each kernel
// folder's cpu.cpp registers its kernels through one function declared here, one per line of
// KernelFolders.def.
#pragma once

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// Adds every folder's kernels.
void registerCpuKernels(KernelRegistry& registry);

#define DGEMMA_KERNEL_FOLDER(Name) void register##Name##CpuKernels(KernelRegistry& registry);
#include "runtime/kernels/KernelFolders.def"
#undef DGEMMA_KERNEL_FOLDER

}  // namespace dgemma
