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
    // Named as the user asked for it, so that a machine without a GPU or a driver reads
    // "--backend cuda: cuda backend: no usable CUDA device: ...".
    try {
      return createCudaBackend(deviceIndex, numThreads);
    } catch (const RuntimeError& error) {
      throw RuntimeError("--backend cuda: " + std::string(error.what()));
    }
#else
    (void)deviceIndex;
    throw RuntimeError("--backend cuda: this dgemma was built without CUDA (nvcc was not found at configure time)");
#endif
  }
  throw InputError("--backend: expected cpu or cuda, got \"" + name + "\"");
}

}  // namespace dgemma
