// The backend-independent half of running f32-only kernels on 16-bit float buffers: which steps are
// wrapped, the f32 twins of their buffers and the twins' layout in one scratch block. Each backend
// supplies only what touches memory: where the scratch block lives and how a buffer is widened into
// its twin and a twin rounded back (runtime/backends/cpu/ReducedPrecision.cpp on the host,
// runtime/backends/cuda/ReducedPrecision.cu in stream order on the device). Both apply one rule: a
// step whose kernel does not read and write 16-bit floats itself runs its f32 kernel on widened
// copies and rounds each 16-bit result once, to nearest even. Plain C++ header.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// One buffer of a step as the f32 kernel sees it: the original, or its f32 twin.
struct WidenedBuffer {
  const Buffer* original = nullptr;
  Buffer twin;  // valid when widened
  bool widened = false;

  WidenedBuffer(const Buffer* buffer, bool widen) : original(buffer), widened(widen) {
    if (!widened) return;
    twin = *buffer;
    twin.dtype = DType::F32;
    twin.aliasOf.reset();
  }
  const Buffer* seen() const { return widened ? &twin : original; }
};

// A step's kernel wrapped so that it runs on f32 twins. A backend derives from it and implements
// run() as: find twinElements() floats of scratch, then runOnTwins().
class WidenedKernelBase : public Kernel {
 public:
  WidenedKernelBase(std::vector<WidenedBuffer> inputs, std::vector<WidenedBuffer> outputs)
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
    for (const auto* list : {&inputs_, &outputs_})
      for (const WidenedBuffer& buffer : *list)
        if (buffer.widened) twinElements_ += static_cast<uint64_t>(buffer.twin.numElements());
  }

  void setInner(std::unique_ptr<Kernel> inner) { inner_ = std::move(inner); }
  const std::vector<WidenedBuffer>& inputs() const { return inputs_; }
  const std::vector<WidenedBuffer>& outputs() const { return outputs_; }

 protected:
  uint64_t twinElements() const { return twinElements_; }

  // Lays the twins out one after another from `storage` (twinElements() floats), calls
  // widen(original, twin, elements) for each widened input, runs the f32 kernel, then
  // narrow(twin, original, elements) for each widened output; `elements` is never 0.
  template <typename Widen, typename Narrow>
  void runOnTwins(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs,
                  float* storage, Widen&& widen, Narrow&& narrow) {
    float* next = storage;
    auto twinOf = [&](const WidenedBuffer& buffer) {
      TensorRef ref{next, &buffer.twin};
      next += buffer.twin.numElements();
      return ref;
    };
    std::vector<TensorRef> innerInputs(inputs), innerOutputs(outputs);
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (!inputs_[i].widened) continue;
      innerInputs[i] = twinOf(inputs_[i]);
      if (const int64_t elements = inputs_[i].twin.numElements(); elements > 0) widen(inputs[i], innerInputs[i], elements);
    }
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs_[i].widened) innerOutputs[i] = twinOf(outputs_[i]);
    inner_->run(context, innerInputs, innerOutputs);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs_[i].widened) continue;
      if (const int64_t elements = outputs_[i].twin.numElements(); elements > 0) narrow(innerOutputs[i], outputs[i], elements);
    }
  }

 private:
  std::vector<WidenedBuffer> inputs_, outputs_;
  uint64_t twinElements_ = 0;
  std::unique_ptr<Kernel> inner_;
};

// Every kernel of `f32Kernels` with its traits. Those registered with KernelTraits::movesBitsOnly or
// handlesReducedFloats are kept as they are; the others, for a step with a buffer whose dtype
// `widens` accepts, become a `WidenedKernelT` (a WidenedKernelBase constructible from the step's
// input and output WidenedBuffers) around the f32 kernel built for the twins' signature.
template <typename WidenedKernelT>
KernelRegistry withWidenedKernels(const KernelRegistry& f32Kernels, bool (*widens)(DType)) {
  auto wrap = [widens](KernelFactory f32Factory) -> KernelFactory {
    return [f32Factory = std::move(f32Factory), widens](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
      bool any = false;
      std::vector<WidenedBuffer> inputs, outputs;
      for (const Buffer* buffer : signature.inputs) any |= inputs.emplace_back(buffer, widens(buffer->dtype)).widened;
      for (const Buffer* buffer : signature.outputs) any |= outputs.emplace_back(buffer, widens(buffer->dtype)).widened;
      if (!any) return f32Factory(signature);
      auto kernel = std::make_unique<WidenedKernelT>(std::move(inputs), std::move(outputs));
      // The twins live in the kernel, so the f32 factory may keep pointers to them.
      KernelSignature widened = signature;
      for (size_t i = 0; i < widened.inputs.size(); ++i) widened.inputs[i] = kernel->inputs()[i].seen();
      for (size_t i = 0; i < widened.outputs.size(); ++i) widened.outputs[i] = kernel->outputs()[i].seen();
      kernel->setInner(f32Factory(widened));
      return kernel;
    };
  };
  KernelRegistry registry;
  for (const std::string& name : f32Kernels.names()) {
    const KernelFactory& factory = *f32Kernels.find(name);
    const KernelTraits& traits = f32Kernels.traits(name);
    registry.add(name, traits.movesBitsOnly || traits.handlesReducedFloats ? factory : wrap(factory), traits);
  }
  return registry;
}

}  // namespace dgemma
