// dequantize on CUDA (docs/kernels.md, "Core kernels"); runtime/kernels/dequantize/cpu.cpp is its CPU
// twin. One thread per output element (grid-stride), the element formed in f32 by Element.h as on the
// CPU and rounded once to the output's dtype (__float2bfloat16_rn, round to nearest even), so the two
// backends agree bit for bit. The NF4 table lives in constant memory: every thread of a warp reads one
// of its 16 entries.
#include <cuda_bf16.h>

#include <cstdint>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/dequantize/Contract.h"
#include "runtime/kernels/dequantize/Element.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

__constant__ float kNf4DeviceTable[16] = DGEMMA_NF4_TABLE;

__device__ inline void storeElement(float* out, int64_t index, float value) { out[index] = value; }
__device__ inline void storeElement(double* out, int64_t index, float value) { out[index] = value; }
__device__ inline void storeElement(__nv_bfloat16* out, int64_t index, float value) {
  out[index] = __float2bfloat16_rn(value);
}

template <typename T>
__global__ void dequantizeInt8Kernel(const int8_t* codes, const float* scales, T* y, int64_t count, int64_t width) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    storeElement(y, i, dequantize::int8Element(codes, scales, i, width));
}

template <typename T>
__global__ void dequantizeNf4Kernel(const uint8_t* codes, const float* absmax, T* y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
    storeElement(y, i, dequantize::nf4Element(codes, absmax, kNf4DeviceTable, i));
}

template <typename T>
class DequantizeCudaKernel final : public Kernel {
 public:
  explicit DequantizeCudaKernel(DequantizeContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (c_.count == 0) return;
    const unsigned grid = cuda::gridFor(static_cast<uint64_t>(c_.count), kThreads);
    cudaStream_t stream = cuda::streamState(context).stream;
    if (c_.format == quant::Format::Int8) {
      dequantizeInt8Kernel<T><<<grid, kThreads, 0, stream>>>(inputs[0].as<const int8_t>(), inputs[1].as<const float>(),
                                                             outputs[0].as<T>(), c_.count, c_.width);
      DGEMMA_CUDA_CHECK_LAUNCH("dequantizeInt8Kernel");
    } else {
      dequantizeNf4Kernel<T><<<grid, kThreads, 0, stream>>>(inputs[0].as<const uint8_t>(), inputs[1].as<const float>(),
                                                            outputs[0].as<T>(), c_.count);
      DGEMMA_CUDA_CHECK_LAUNCH("dequantizeNf4Kernel");
    }
  }

 private:
  DequantizeContract c_;
};

std::unique_ptr<Kernel> createDequantizeCudaKernel(const KernelSignature& signature) {
  const DequantizeContract c = parseDequantizeContract(signature);
  if (c.outputDtype == DType::BF16) return std::make_unique<DequantizeCudaKernel<__nv_bfloat16>>(c);
  if (c.outputDtype == DType::F64) return std::make_unique<DequantizeCudaKernel<double>>(c);
  return std::make_unique<DequantizeCudaKernel<float>>(c);
}

}  // namespace

void registerDequantizeCudaKernels(KernelRegistry& registry) {
  registry.add("dequantize", createDequantizeCudaKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
