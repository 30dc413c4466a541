#include "runtime/kernels/CudaKernels.h"

namespace dgemma {

void registerCudaKernels(KernelRegistry& registry) {
  registerElementwiseCudaKernels(registry);
  registerMatmulCudaKernels(registry);
  registerRmsNormCudaKernels(registry);
  registerSoftmaxCudaKernels(registry);
  registerMoeDispatchCudaKernels(registry);
  registerCanvasSampleCudaKernels(registry);
  registerAttentionCudaKernels(registry);
  registerCrossEntropyCudaKernels(registry);
}

}  // namespace dgemma
