#include "runtime/backends/cuda/ReducedPrecision.h"

#include <cstdint>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernel_api/WidenedKernels.h"
#include "runtime/kernels/KernelElements.h"

namespace dgemma::cuda {
namespace {

constexpr unsigned kThreads = 256;

__global__ void widenBf16Kernel(const uint16_t* source, float* destination, uint64_t count) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    destination[i] = kernels::loadFloat(source, static_cast<int64_t>(i));
}

__global__ void narrowToBf16Kernel(const float* source, uint16_t* destination, uint64_t count) {
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t i = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride)
    kernels::storeFloat(destination, static_cast<int64_t>(i), source[i]);
}

bool isBf16(DType dtype) { return dtype == DType::BF16; }

class DeviceWidenedKernel final : public WidenedKernelBase {
 public:
  using WidenedKernelBase::WidenedKernelBase;

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cudaStream_t stream = streamState(context).stream;
    float* storage = nullptr;
    if (twinElements() > 0)
      DGEMMA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&storage), twinElements() * sizeof(float), stream));
    // Freed in stream order also when the inner kernel throws.
    struct Release {
      float* storage;
      cudaStream_t stream;
      ~Release() {
        if (storage != nullptr) cudaFreeAsync(storage, stream);
      }
    } release{storage, stream};
    runOnTwins(
        context, inputs, outputs, storage,
        [&](const TensorRef& original, const TensorRef& twin, int64_t elements) {
          const uint64_t count = static_cast<uint64_t>(elements);
          widenBf16Kernel<<<gridFor(count, kThreads), kThreads, 0, stream>>>(original.as<const uint16_t>(), twin.as<float>(),
                                                                             count);
          DGEMMA_CUDA_CHECK_LAUNCH("widenBf16Kernel");
        },
        [&](const TensorRef& twin, const TensorRef& original, int64_t elements) {
          const uint64_t count = static_cast<uint64_t>(elements);
          narrowToBf16Kernel<<<gridFor(count, kThreads), kThreads, 0, stream>>>(twin.as<const float>(),
                                                                                original.as<uint16_t>(), count);
          DGEMMA_CUDA_CHECK_LAUNCH("narrowToBf16Kernel");
        });
  }
};

}  // namespace

KernelRegistry withWidenedBf16(const KernelRegistry& f32Kernels) {
  return withWidenedKernels<DeviceWidenedKernel>(f32Kernels, isBf16);
}

}  // namespace dgemma::cuda
