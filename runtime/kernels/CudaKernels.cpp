#include "runtime/kernels/CudaKernels.h"

namespace dgemma {

void registerCudaKernels(KernelRegistry& registry) {
#define DGEMMA_KERNEL_FOLDER(Name) register##Name##CudaKernels(registry);
#include "runtime/kernels/KernelFolders.def"
#undef DGEMMA_KERNEL_FOLDER
}

}  // namespace dgemma
