// Internal to the CUDA backend and the CUDA kernels (never included by code built without CUDA):
// error checking for CUDA runtime / cuBLAS / cuBLASLt calls, the per-stream state a kernel finds in
// ExecContext::backendState, and launch geometry.
#pragma once

#include <cstdint>

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "runtime/kernel_api/Kernel.h"
#include "support/Error.h"

namespace dgemma::cuda {

// What ExecContext::backendState points to for a context of the CUDA backend. One per plan stream:
// each stream owns its cuBLAS handle (bound to that stream once, at creation), so kernels never call
// cublasSetStream and concurrent streams never share a cuBLAS workspace, and its cuBLASLt handle
// (cuBLASLt takes the stream and the workspace with each cublasLtMatmul call).
struct StreamState {
  static constexpr uint32_t kMagic = 0x64637564;  // tells a CUDA context from a foreign one
  uint32_t magic = kMagic;
  cudaStream_t stream = nullptr;
  cublasHandle_t cublas = nullptr;
  cublasLtHandle_t cublasLt = nullptr;
  int device = 0;
};

// "file:line: what: cudaErrorX (message)". Throws RuntimeError.
[[noreturn]] void throwCudaError(cudaError_t error, const char* what, const char* file, int line);
[[noreturn]] void throwCublasError(cublasStatus_t status, const char* what, const char* file, int line);

// The state of a context handed out by the CUDA backend; throws RuntimeError when the context does
// not come from it (e.g. a CPU context passed to a CUDA kernel).
StreamState& streamState(const ExecContext& context);

// Kernel launch geometry: blocks for a grid-stride loop over `count` items (at least 1, at most 2^31-1).
unsigned gridFor(uint64_t count, unsigned threadsPerBlock);

// Calls launch(Word{}) with the unsigned integer type of an element of `bytes` bytes (1, 2, 4, else
// 8): the kernels that move elements as their bits are instantiated once per element size.
template <typename Launch>
void withElementWord(uint64_t bytes, Launch&& launch) {
  switch (bytes) {
    case 1: return launch(uint8_t{});
    case 2: return launch(uint16_t{});
    case 4: return launch(uint32_t{});
    default: return launch(uint64_t{});
  }
}

}  // namespace dgemma::cuda

#define DGEMMA_CUDA_CHECK(call)                                                  \
  do {                                                                           \
    cudaError_t dgemmaCudaStatus_ = (call);                                      \
    if (dgemmaCudaStatus_ != cudaSuccess)                                        \
      ::dgemma::cuda::throwCudaError(dgemmaCudaStatus_, #call, __FILE__, __LINE__); \
  } while (0)

// cuBLAS and cuBLASLt calls (both return cublasStatus_t).
#define DGEMMA_CUBLAS_CHECK(call)                                                    \
  do {                                                                               \
    cublasStatus_t dgemmaCublasStatus_ = (call);                                     \
    if (dgemmaCublasStatus_ != CUBLAS_STATUS_SUCCESS)                                \
      ::dgemma::cuda::throwCublasError(dgemmaCublasStatus_, #call, __FILE__, __LINE__); \
  } while (0)

// After a <<<...>>> launch: reports a bad launch configuration (asynchronous faults surface at the
// next synchronizing call).
#define DGEMMA_CUDA_CHECK_LAUNCH(kernelName)                                                     \
  do {                                                                                          \
    cudaError_t dgemmaCudaStatus_ = cudaGetLastError();                                         \
    if (dgemmaCudaStatus_ != cudaSuccess)                                                       \
      ::dgemma::cuda::throwCudaError(dgemmaCudaStatus_, "launch of " kernelName, __FILE__, __LINE__); \
  } while (0)
