#include "runtime/kernels/CpuKernels.h"

namespace dgemma {

void registerCpuKernels(KernelRegistry& registry) {
#define DGEMMA_KERNEL_FOLDER(Name) register##Name##CpuKernels(registry);
#include "runtime/kernels/KernelFolders.def"
#undef DGEMMA_KERNEL_FOLDER
}

}  // namespace dgemma
