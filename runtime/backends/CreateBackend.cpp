#include "runtime/kernel_api/Backend.h"
#include "runtime/backends/cpu/CpuBackend.h"
#include "support/Error.h"
#ifdef DGEMMA_HAVE_CUDA
#include "runtime/backends/cuda/CudaBackend.h"
#endif

namespace dgemma {

std::unique_ptr<Backend> createBackend(const std::string& name, int64_t numThreads, int64_t deviceIndex) {
  if (name == "cpu") return createCpuBackend(numThreads);
  if (name == "cuda") {
#ifdef DGEMMA_HAVE_CUDA
    return createCudaBackend(deviceIndex);
#else
    (void)deviceIndex;
    throw RuntimeError("backend \"cuda\": this dgemma was built without CUDA (nvcc was not found at configure time)");
#endif
  }
  throw InputError("--backend: expected cpu or cuda, got \"" + name + "\"");
}

}  // namespace dgemma
