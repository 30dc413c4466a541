// cast on CUDA (docs/kernels.md, "Core kernels"), every pair of dtypes the contract admits; runtime/kernels/
// elementwise/cpu.cpp's CastKernel is its CPU twin. As there, an element goes through f64 (from a
// float) or i64 (from an integer): float -> float rounds the f64 once to the target (bf16 and f16
// through CastMath.h's round-to-odd f32, so each is the correctly rounded f64, round to nearest even),
// integer -> integer wraps, integer -> float goes through f64. CastMath.h's conversions are the CPU's
// bit for bit (checked on the host), so every output equals the CPU kernel's. One thread per element
// (grid-stride); the dtypes are kernel arguments, the same for every thread. Same dtypes: one copy.
#include <cstdint>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/elementwise/CudaParts.h"
#include "runtime/kernels/elementwise/CastMath.h"
#include "runtime/kernels/elementwise/Contract.h"
#include "support/DType.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

__device__ double loadFloat(const void* source, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(source)[i];
    case DType::F64: return static_cast<const double*>(source)[i];
    case DType::BF16: return cast::bf16BitsToF32(static_cast<const uint16_t*>(source)[i]);
    default: return cast::f16BitsToF32(static_cast<const uint16_t*>(source)[i]);  // F16
  }
}

__device__ void storeFloat(void* destination, DType dtype, int64_t i, double value) {
  switch (dtype) {
    case DType::F32: static_cast<float*>(destination)[i] = static_cast<float>(value); break;
    case DType::F64: static_cast<double*>(destination)[i] = value; break;
    case DType::BF16: static_cast<uint16_t*>(destination)[i] = cast::f64ToBf16Bits(value); break;
    default: static_cast<uint16_t*>(destination)[i] = cast::f64ToF16Bits(value); break;  // F16
  }
}

__device__ int64_t loadInteger(const void* source, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::I64: return static_cast<const int64_t*>(source)[i];
    case DType::I32: return static_cast<const int32_t*>(source)[i];
    case DType::I8: return static_cast<const int8_t*>(source)[i];
    default: return static_cast<const uint8_t*>(source)[i];  // U8, Bool
  }
}

// Narrowing wraps (two's complement), as on the CPU; bool is 1 for any nonzero value.
__device__ void storeInteger(void* destination, DType dtype, int64_t i, int64_t value) {
  switch (dtype) {
    case DType::I64: static_cast<int64_t*>(destination)[i] = value; break;
    case DType::I32: static_cast<int32_t*>(destination)[i] = static_cast<int32_t>(value); break;
    case DType::I8: static_cast<int8_t*>(destination)[i] = static_cast<int8_t>(value); break;
    case DType::U8: static_cast<uint8_t*>(destination)[i] = static_cast<uint8_t>(value); break;
    default: static_cast<uint8_t*>(destination)[i] = value != 0; break;  // Bool
  }
}

__global__ void castKernel(const void* source, DType from, bool fromFloat, void* destination, DType to, bool toFloat,
                           int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    if (fromFloat)
      storeFloat(destination, to, i, loadFloat(source, from, i));
    else if (!toFloat)
      storeInteger(destination, to, i, loadInteger(source, from, i));
    else
      storeFloat(destination, to, i, static_cast<double>(loadInteger(source, from, i)));
  }
}

class CastCudaKernel final : public Kernel {
 public:
  explicit CastCudaKernel(CastContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t count = inputs[0].numElements();
    if (count == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    if (c_.from == c_.to) {
      DGEMMA_CUDA_CHECK(cudaMemcpyAsync(outputs[0].data, inputs[0].data, inputs[0].buffer->bytes(),
                                        cudaMemcpyDeviceToDevice, stream));
      return;
    }
    castKernel<<<cuda::gridFor(static_cast<uint64_t>(count), kThreads), kThreads, 0, stream>>>(
        inputs[0].data, c_.from, isFloating(c_.from), outputs[0].data, c_.to, isFloating(c_.to), count);
    DGEMMA_CUDA_CHECK_LAUNCH("castKernel");
  }

 private:
  CastContract c_;
};

std::unique_ptr<Kernel> createCastCudaKernel(const KernelSignature& signature) {
  return std::make_unique<CastCudaKernel>(parseCastContract(signature));
}

}  // namespace

void registerCastCudaKernels(KernelRegistry& registry) {
  registry.add("cast", createCastCudaKernel, KernelTraits{.movesBitsOnly = true});
}

}  // namespace dgemma
