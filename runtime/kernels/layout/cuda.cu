// transpose, reshape, concat and slice on CUDA (docs/kernels.md), any dtype: data movement only, so
// every output equals the CPU kernel's (runtime/kernels/layout/cpu.cpp) bit for bit. transpose is a
// thread per element of y (grid-stride) reading x through TransposeIndex.h's map, moving elements
// of 1, 2, 4 or 8 bytes as they are; reshape is one device-to-device copy; concat and slice are
// strided 2-D copies (cudaMemcpy2DAsync: one row per index of the dims before `dim`), all on the
// step's stream.
#include <cstdint>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/layout/Contract.h"
#include "runtime/kernels/layout/TransposeIndex.h"
#include "support/Shape.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

template <typename Word>
__global__ void transposeKernel(const Word* x, Word* y, layout::TransposeMap map, int64_t count) {
  for (int64_t index = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; index < count;
       index += int64_t(gridDim.x) * blockDim.x) {
    const int64_t source = layout::sourceOffset(map, index);
    DGEMMA_CUDA_BOUNDS(source, count);
    y[index] = x[source];
  }
}

class TransposeCudaKernel final : public Kernel {
 public:
  TransposeCudaKernel(layout::TransposeMap map, int64_t count, uint64_t elementBytes)
      : map_(map), count_(count), elementBytes_(elementBytes) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (count_ == 0) return;
    cuda::withElementWord(elementBytes_, [&](auto word) { launch<decltype(word)>(context, inputs, outputs); });
  }

 private:
  template <typename Word>
  void launch(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) {
    transposeKernel<<<cuda::gridFor(static_cast<uint64_t>(count_), kThreads), kThreads, 0,
                      cuda::streamState(context).stream>>>(inputs[0].as<const Word>(), outputs[0].as<Word>(), map_,
                                                           count_);
    DGEMMA_CUDA_CHECK_LAUNCH("transposeKernel");
  }

  layout::TransposeMap map_;
  int64_t count_;
  uint64_t elementBytes_;
};

std::unique_ptr<Kernel> createTransposeCudaKernel(const KernelSignature& signature) {
  const TransposeContract c = parseTransposeContract(signature);
  layout::TransposeMap map;
  if (!layout::makeTransposeMap(c.inputShape, c.perm, map))
    failSignature(signature, "input x " + shapeToString(c.inputShape) + ": the CUDA transpose moves at most " +
                                 std::to_string(layout::TransposeMap::kMaxRank) + " dims of size above 1");
  return std::make_unique<TransposeCudaKernel>(map, c.count, c.elementBytes);
}

class ReshapeCudaKernel final : public Kernel {
 public:
  explicit ReshapeCudaKernel(uint64_t bytes) : bytes_(bytes) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (bytes_ == 0 || outputs[0].data == inputs[0].data) return;
    DGEMMA_CUDA_CHECK(cudaMemcpyAsync(outputs[0].data, inputs[0].data, bytes_, cudaMemcpyDeviceToDevice,
                                      cuda::streamState(context).stream));
  }

 private:
  uint64_t bytes_;
};

std::unique_ptr<Kernel> createReshapeCudaKernel(const KernelSignature& signature) {
  return std::make_unique<ReshapeCudaKernel>(parseReshapeContract(signature).bytes);
}

// Copies `height` rows of `width` bytes between pitched layouts on the stream.
void copyRows(ExecContext& context, void* destination, uint64_t destinationPitch, const void* source,
              uint64_t sourcePitch, uint64_t width, int64_t height) {
  if (width == 0 || height == 0) return;
  DGEMMA_CUDA_CHECK(cudaMemcpy2DAsync(destination, destinationPitch, source, sourcePitch, width,
                                      static_cast<size_t>(height), cudaMemcpyDeviceToDevice,
                                      cuda::streamState(context).stream));
}

class ConcatCudaKernel final : public Kernel {
 public:
  explicit ConcatCudaKernel(ConcatContract c) : c_(std::move(c)) {
    for (uint64_t bytes : c_.blockBytes) rowBytes_ += bytes;
  }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    uint64_t column = 0;
    for (size_t i = 0; i < inputs.size(); ++i) {
      copyRows(context, outputs[0].as<uint8_t>() + column, rowBytes_, inputs[i].data, c_.blockBytes[i], c_.blockBytes[i],
               c_.outerCount);
      column += c_.blockBytes[i];
    }
  }

 private:
  ConcatContract c_;
  uint64_t rowBytes_ = 0;
};

std::unique_ptr<Kernel> createConcatCudaKernel(const KernelSignature& signature) {
  return std::make_unique<ConcatCudaKernel>(parseConcatContract(signature));
}

class SliceCudaKernel final : public Kernel {
 public:
  explicit SliceCudaKernel(SliceContract c) : c_(c) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    copyRows(context, outputs[0].data, c_.outputRowBytes, inputs[0].as<const uint8_t>() + c_.offsetBytes,
             c_.inputRowBytes, c_.outputRowBytes, c_.outerCount);
  }

 private:
  SliceContract c_;
};

std::unique_ptr<Kernel> createSliceCudaKernel(const KernelSignature& signature) {
  return std::make_unique<SliceCudaKernel>(parseSliceContract(signature));
}

}  // namespace

void registerLayoutCudaKernels(KernelRegistry& registry) {
  const KernelTraits movesBits{.movesBitsOnly = true};
  registry.add("transpose", createTransposeCudaKernel, movesBits);
  registry.add("reshape", createReshapeCudaKernel, movesBits);
  registry.add("concat", createConcatCudaKernel, movesBits);
  registry.add("slice", createSliceCudaKernel, movesBits);
}

}  // namespace dgemma
