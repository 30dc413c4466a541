#include "runtime/backends/cpu/ReducedPrecision.h"

#include "support/DType.h"
#include "runtime/kernel_api/WidenedKernels.h"
#include "runtime/kernels/CpuKernelSupport.h"

namespace dgemma {

namespace {

bool isReducedFloat(DType dtype) { return dtype == DType::BF16 || dtype == DType::F16; }

void widen(ExecContext& context, DType dtype, const void* source, float* destination, int64_t count) {
  const uint16_t* bits = static_cast<const uint16_t*>(source);
  cpu::parallelFor(context, count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
    if (dtype == DType::BF16)
      for (int64_t i = begin; i < end; ++i) destination[i] = bf16BitsToF32(bits[i]);
    else
      for (int64_t i = begin; i < end; ++i) destination[i] = f16BitsToF32(bits[i]);
  });
}

void narrow(ExecContext& context, DType dtype, const float* source, void* destination, int64_t count) {
  uint16_t* bits = static_cast<uint16_t*>(destination);
  cpu::parallelFor(context, count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
    if (dtype == DType::BF16)
      for (int64_t i = begin; i < end; ++i) bits[i] = f32ToBf16Bits(source[i]);
    else
      for (int64_t i = begin; i < end; ++i) bits[i] = f32ToF16Bits(source[i]);
  });
}

// The twins' storage, shared by every widened step the calling thread runs (one step at a time), so
// it costs the largest step's f32 footprint rather than one copy of every 16-bit buffer.
std::vector<float>& twinStorage(size_t elements) {
  thread_local std::vector<float> storage;
  if (storage.size() < elements) storage.resize(elements);
  return storage;
}

class HostWidenedKernel final : public WidenedKernelBase {
 public:
  using WidenedKernelBase::WidenedKernelBase;

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    runOnTwins(
        context, inputs, outputs, twinStorage(twinElements()).data(),
        [&](const TensorRef& original, const TensorRef& twin, int64_t elements) {
          widen(context, original.buffer->dtype, original.data, twin.as<float>(), elements);
        },
        [&](const TensorRef& twin, const TensorRef& original, int64_t elements) {
          narrow(context, original.buffer->dtype, twin.as<float>(), original.data, elements);
        });
  }
};

}  // namespace

KernelRegistry withReducedPrecisionFloats(const KernelRegistry& f32Kernels) {
  return withWidenedKernels<HostWidenedKernel>(f32Kernels, isReducedFloat);
}

}  // namespace dgemma
