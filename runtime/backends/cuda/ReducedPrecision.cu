#include "runtime/backends/cuda/ReducedPrecision.h"

#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/backends/cuda/CudaCommon.h"
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

// One buffer of the step as the f32 kernel sees it: the original, or its f32 twin.
struct WidenedBuffer {
  const Buffer* original = nullptr;
  Buffer twin;  // valid when widened
  bool widened = false;

  explicit WidenedBuffer(const Buffer* buffer) : original(buffer), widened(buffer->dtype == DType::BF16) {
    if (!widened) return;
    twin = *buffer;
    twin.dtype = DType::F32;
    twin.aliasOf.reset();
  }
  const Buffer* seen() const { return widened ? &twin : original; }
};

class WidenedKernel final : public Kernel {
 public:
  WidenedKernel(std::vector<WidenedBuffer> inputs, std::vector<WidenedBuffer> outputs)
      : inputs_(std::move(inputs)), outputs_(std::move(outputs)) {
    for (const auto* list : {&inputs_, &outputs_})
      for (const WidenedBuffer& buffer : *list)
        if (buffer.widened) twinElements_ += static_cast<uint64_t>(buffer.twin.numElements());
  }

  void setInner(std::unique_ptr<Kernel> inner) { inner_ = std::move(inner); }
  const std::vector<WidenedBuffer>& inputs() const { return inputs_; }
  const std::vector<WidenedBuffer>& outputs() const { return outputs_; }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cudaStream_t stream = streamState(context).stream;
    float* storage = nullptr;
    if (twinElements_ > 0)
      DGEMMA_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&storage), twinElements_ * sizeof(float), stream));
    // Freed in stream order also when the inner kernel throws.
    struct Release {
      float* storage;
      cudaStream_t stream;
      ~Release() {
        if (storage != nullptr) cudaFreeAsync(storage, stream);
      }
    } release{storage, stream};
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
      const uint64_t count = static_cast<uint64_t>(inputs_[i].twin.numElements());
      if (count == 0) continue;
      widenBf16Kernel<<<gridFor(count, kThreads), kThreads, 0, stream>>>(inputs[i].as<const uint16_t>(),
                                                                         innerInputs[i].as<float>(), count);
      DGEMMA_CUDA_CHECK_LAUNCH("widenBf16Kernel");
    }
    for (size_t i = 0; i < outputs.size(); ++i)
      if (outputs_[i].widened) innerOutputs[i] = twinOf(outputs_[i]);
    inner_->run(context, innerInputs, innerOutputs);
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs_[i].widened) continue;
      const uint64_t count = static_cast<uint64_t>(outputs_[i].twin.numElements());
      if (count == 0) continue;
      narrowToBf16Kernel<<<gridFor(count, kThreads), kThreads, 0, stream>>>(innerOutputs[i].as<const float>(),
                                                                            outputs[i].as<uint16_t>(), count);
      DGEMMA_CUDA_CHECK_LAUNCH("narrowToBf16Kernel");
    }
  }

 private:
  std::vector<WidenedBuffer> inputs_, outputs_;
  uint64_t twinElements_ = 0;
  std::unique_ptr<Kernel> inner_;
};

bool hasBf16(const KernelSignature& signature) {
  for (const auto* list : {&signature.inputs, &signature.outputs})
    for (const Buffer* buffer : *list)
      if (buffer->dtype == DType::BF16) return true;
  return false;
}

KernelFactory widening(KernelFactory f32Factory) {
  return [f32Factory = std::move(f32Factory)](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    if (!hasBf16(signature)) return f32Factory(signature);
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

KernelRegistry withWidenedBf16(const KernelRegistry& f32Kernels) {
  KernelRegistry registry;
  for (const std::string& name : f32Kernels.names()) {
    const KernelFactory& factory = *f32Kernels.find(name);
    const KernelTraits& traits = f32Kernels.traits(name);
    registry.add(name, traits.movesBitsOnly || traits.handlesReducedFloats ? factory : widening(factory), traits);
  }
  return registry;
}

}  // namespace dgemma::cuda
