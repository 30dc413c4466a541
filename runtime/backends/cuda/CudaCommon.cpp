#include "runtime/backends/cuda/CudaCommon.h"

#include <string>

#include "support/Error.h"

namespace dgemma {
namespace cuda {

static std::string location(const char* file, int line) {
  std::string path = file;
  // Keep the path from the repository root ("runtime/...") when the compiler gave an absolute one.
  size_t root = path.rfind("/runtime/");
  if (root != std::string::npos) path = path.substr(root + 1);
  return path + ":" + std::to_string(line);
}

void throwCudaError(cudaError_t error, const char* what, const char* file, int line) {
  // Clear the thread's last-error slot so that a later launch check does not report this error again
  // (sticky errors, e.g. a kernel fault, stay on the context and are reported by every call).
  cudaGetLastError();
  throw RuntimeError("cuda backend: " + location(file, line) + ": " + what + ": " + cudaGetErrorName(error) + " (" +
                     cudaGetErrorString(error) + ")");
}

void throwCublasError(cublasStatus_t status, const char* what, const char* file, int line) {
  throw RuntimeError("cuda backend: " + location(file, line) + ": " + what + ": " + cublasGetStatusName(status) +
                     " (" + cublasGetStatusString(status) + ")");
}

StreamState& streamState(const ExecContext& context) {
  auto* state = static_cast<StreamState*>(context.backendState);
  if (state == nullptr || state->magic != StreamState::kMagic)
    throw RuntimeError("cuda kernel run with an execution context that does not come from the cuda backend");
  return *state;
}

unsigned gridFor(uint64_t count, unsigned threadsPerBlock) {
  uint64_t blocks = (count + threadsPerBlock - 1) / threadsPerBlock;
  if (blocks < 1) blocks = 1;
  if (blocks > 0x7fffffffu) blocks = 0x7fffffffu;
  return static_cast<unsigned>(blocks);
}

}  // namespace cuda

}  // namespace dgemma
