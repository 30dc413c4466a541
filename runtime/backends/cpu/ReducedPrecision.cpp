#include "runtime/backends/cpu/ReducedPrecision.h"

#include "support/DType.h"
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

// One buffer of the step as the f32 kernel sees it: the original, or an f32 twin.
struct WidenedBuffer {
  const Buffer* original = nullptr;
  Buffer twin;  // valid when widened
  bool widened = false;

  explicit WidenedBuffer(const Buffer* buffer) : original(buffer), widened(isReducedFloat(buffer->dtype)) {
    if (!widened) return;
    twin = *buffer;
    twin.dtype = DType::F32;
    twin.aliasOf.reset();
  }
  const Buffer* seen() const { return widened ? &twin : original; }
};

// The twins' storage, shared by every widened step the calling thread runs (one step at a time), so
// it costs the largest step's f32 footprint rather than one copy of every 16-bit buffer.
std::vector<float>& twinStorage(size_t elements) {
  thread_local std::vector<float> storage;
  if (storage.size() < elements) storage.resize(elements);
  return storage;
}

class WidenedKernel final : public Kernel {
 public:
  WidenedKernel(std::vector<WidenedBuffer> inputs, std::vector<WidenedBuffer> outputs)
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
    for (const auto* list : {&inputs_, &outputs_})
      for (const WidenedBuffer& buffer : *list)
        if (buffer.widened) twinElements_ += static_cast<size_t>(buffer.twin.numElements());
  }

  void setInner(std::unique_ptr<Kernel> inner) { inner_ = std::move(inner); }
  const std::vector<WidenedBuffer>& inputs() const { return inputs_; }
  const std::vector<WidenedBuffer>& outputs() const { return outputs_; }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    float* next = twinStorage(twinElements_).data();
    auto twinOf = [&](const WidenedBuffer& buffer) {
      TensorRef ref{next, &buffer.twin};
      next += buffer.twin.numElements();
      return ref;
    };
    std::vector<TensorRef> innerInputs(inputs), innerOutputs(outputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs_[i].widened) continue;
      innerInputs[i] = twinOf(inputs_[i]);
      widen(context, inputs_[i].original->dtype, inputs[i].data, innerInputs[i].as<float>(), inputs_[i].twin.numElements());
    }
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs_[i].widened) innerOutputs[i] = twinOf(outputs_[i]);
    inner_->run(context, innerInputs, innerOutputs);
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs_[i].widened)
        narrow(context, outputs_[i].original->dtype, innerOutputs[i].as<float>(), outputs[i].data, outputs_[i].twin.numElements());
  }

 private:
  std::vector<WidenedBuffer> inputs_, outputs_;
  size_t twinElements_ = 0;
  std::unique_ptr<Kernel> inner_;
};

bool hasReducedFloat(const KernelSignature& signature) {
  for (const auto* list : {&signature.inputs, &signature.outputs})
    for (const Buffer* buffer : *list)
      if (isReducedFloat(buffer->dtype)) return true;
  return false;
}

KernelFactory widening(KernelFactory f32Factory) {
  return [f32Factory = std::move(f32Factory)](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    if (!hasReducedFloat(signature)) return f32Factory(signature);
    std::vector<WidenedBuffer> inputs, outputs;
    for (const Buffer* buffer : signature.inputs) inputs.emplace_back(buffer);
    for (const Buffer* buffer : signature.outputs) outputs.emplace_back(buffer);
    auto kernel = std::make_unique<WidenedKernel>(std::move(inputs), std::move(outputs));
    // The twins live in the kernel, so the f32 factory may keep pointers to them.
    KernelSignature widened = signature;
    for (size_t i = 0; i < widened.inputs.size(); ++i) widened.inputs[i] = kernel->inputs()[i].seen();
    for (size_t i = 0; i < widened.outputs.size(); ++i) widened.outputs[i] = kernel->outputs()[i].seen();
    kernel->setInner(f32Factory(widened));
    return kernel;
  };
}

}  // namespace

KernelRegistry withReducedPrecisionFloats(const KernelRegistry& f32Kernels) {
  KernelRegistry registry;
  for (const std::string& name : f32Kernels.names()) {
    const KernelFactory& factory = *f32Kernels.find(name);
    const KernelTraits& traits = f32Kernels.traits(name);
    registry.add(name, traits.movesBitsOnly || traits.handlesReducedFloats ? factory : widening(factory), traits);
  }
  return registry;
}

}  // namespace dgemma
