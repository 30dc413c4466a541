#include "runtime/kernels/CpuKernels.h"

namespace dgemma {

void registerCpuKernels(KernelRegistry& registry) {
  registerElementwiseCpuKernels(registry);
  registerFusedElementwiseCpuKernels(registry);
  registerMatmulCpuKernels(registry);
  registerRmsNormCpuKernels(registry);
  registerSoftmaxCpuKernels(registry);
  registerReduceCpuKernels(registry);
  registerLayoutCpuKernels(registry);
  registerGatherCpuKernels(registry);
  registerRandomCpuKernels(registry);
  registerRopeCpuKernels(registry);
  registerAttentionCpuKernels(registry);
  registerMoeCpuKernels(registry);
  registerMoeDispatchCpuKernels(registry);
  registerCrossEntropyCpuKernels(registry);
  registerCanvasSampleCpuKernels(registry);
  registerOptimizerCpuKernels(registry);
}

}  // namespace dgemma
