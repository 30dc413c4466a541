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
  registerRandomCudaKernels(registry);
  registerOptimizerCudaKernels(registry);
  registerReduceCudaKernels(registry);
  registerRopeCudaKernels(registry);
  registerGatherCudaKernels(registry);
  registerLayoutCudaKernels(registry);
  registerCastCudaKernels(registry);
  registerFillCudaKernels(registry);
  registerSelectCudaKernels(registry);
  registerMoeRouteCudaKernels(registry);
  registerMoeExpertsCudaKernels(registry);
  registerFusedElementwiseCudaKernels(registry);
}

}  // namespace dgemma
