// dequantize: a frozen base weight decoded from its int8 or NF4 codes and scales, each element formed
// in f32 and rounded once to the output's dtype (docs/kernels.md, "Core kernels"). It writes bf16 itself
// (KernelTraits::handlesReducedFloats): widening would only add an f32 copy of the weight.
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/dequantize/Contract.h"
#include "runtime/kernels/dequantize/Element.h"
#include "support/DType.h"

namespace dgemma {
namespace {

template <typename T>
void store(T* out, int64_t index, float value) {
  if constexpr (std::is_same_v<T, uint16_t>) out[index] = f32ToBf16Bits(value);
  else out[index] = static_cast<T>(value);
}

template <typename T>
class DequantizeKernel final : public Kernel {
 public:
  explicit DequantizeKernel(DequantizeContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const float* scales = inputs[1].as<const float>();
    T* y = outputs[0].as<T>();
    const int64_t width = c_.width;
    if (c_.format == quant::Format::Int8) {
      const int8_t* codes = inputs[0].as<const int8_t>();
      cpu::parallelFor(context, c_.count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) store(y, i, dequantize::int8Element(codes, scales, i, width));
      });
    } else {
      const uint8_t* codes = inputs[0].as<const uint8_t>();
      cpu::parallelFor(context, c_.count, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) store(y, i, dequantize::nf4Element(codes, scales, quant::kNf4Table, i));
      });
    }
  }

 private:
  DequantizeContract c_;
};

std::unique_ptr<Kernel> createDequantizeKernel(const KernelSignature& signature) {
  const DequantizeContract c = parseDequantizeContract(signature);
  if (c.outputDtype == DType::BF16) return std::make_unique<DequantizeKernel<uint16_t>>(c);
  if (c.outputDtype == DType::F64) return std::make_unique<DequantizeKernel<double>>(c);
  return std::make_unique<DequantizeKernel<float>>(c);
}

}  // namespace

void registerDequantizeCpuKernels(KernelRegistry& registry) {
  registry.add("dequantize", createDequantizeKernel, KernelTraits{.handlesReducedFloats = true});
}

}  // namespace dgemma
