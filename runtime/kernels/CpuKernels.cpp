#include "runtime/kernels/CpuKernels.h"

namespace dgemma {

void registerCpuKernels(KernelRegistry& registry) {
  registerElementwiseCpuKernels(registry);
  registerMatmulCpuKernels(registry);
  registerRmsNormCpuKernels(registry);
  registerSoftmaxCpuKernels(registry);
  registerReduceCpuKernels(registry);
  registerLayoutCpuKernels(registry);
  registerGatherCpuKernels(registry);
  registerRandomCpuKernels(registry);
}

}  // namespace dgemma
