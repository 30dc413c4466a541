// fill on CUDA (docs/kernels.md, "Core kernels"), any dtype; runtime/kernels/elementwise/cpu.cpp's FillKernel
// is its CPU twin. Both store FillPattern.h's element bit pattern, computed on the host at plan load,
// so the bytes are the same: one thread per element (grid-stride) stores the pattern as a word of the
// element's size; one-byte elements are a cudaMemsetAsync.
#include <cstdint>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/elementwise/CudaParts.h"
#include "runtime/kernels/elementwise/Contract.h"
#include "runtime/kernels/elementwise/FillPattern.h"
#include "support/DType.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

template <typename Word>
__global__ void fillKernel(Word* y, Word pattern, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    y[i] = pattern;
}

class FillCudaKernel final : public Kernel {
 public:
  FillCudaKernel(uint64_t pattern, size_t elementSize) : pattern_(pattern), elementSize_(elementSize) {}

  void run(ExecContext& context, const std::vector<TensorRef>&, const std::vector<TensorRef>& outputs) override {
    const int64_t count = outputs[0].numElements();
    if (count == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    switch (elementSize_) {
      case 1:
        DGEMMA_CUDA_CHECK(cudaMemsetAsync(outputs[0].data, static_cast<int>(pattern_ & 0xffu), count, stream));
        return;
      case 2: return launch(outputs[0].as<uint16_t>(), static_cast<uint16_t>(pattern_), count, stream);
      case 4: return launch(outputs[0].as<uint32_t>(), static_cast<uint32_t>(pattern_), count, stream);
      default: return launch(outputs[0].as<uint64_t>(), pattern_, count, stream);
    }
  }

 private:
  template <typename Word>
  static void launch(Word* y, Word pattern, int64_t count, cudaStream_t stream) {
    fillKernel<<<cuda::gridFor(static_cast<uint64_t>(count), kThreads), kThreads, 0, stream>>>(y, pattern, count);
    DGEMMA_CUDA_CHECK_LAUNCH("fillKernel");
  }

  uint64_t pattern_;  // the element's bytes in its low elementSize_ bytes
  size_t elementSize_;
};

std::unique_ptr<Kernel> createFillCudaKernel(const KernelSignature& signature) {
  const FillContract contract = parseFillContract(signature);
  return std::make_unique<FillCudaKernel>(fill::fillPattern(contract), dtypeSize(contract.dtype));
}

}  // namespace

void registerFillCudaKernels(KernelRegistry& registry) {
  registry.add("fill", createFillCudaKernel, KernelTraits{.movesBitsOnly = true});
}

}  // namespace dgemma
