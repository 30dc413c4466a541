// select on CUDA (docs/kernels.md, "Core kernels"), any value dtype; runtime/kernels/elementwise/cpu.cpp's
// SelectKernel is its CPU twin. One thread per output element (grid-stride) reads the condition and
// the chosen side through SelectIndex.h's broadcast map and copies the value as a word of its size,
// so the output equals the CPU's bit for bit. An output that is one side's own storage (an in-place
// select) is safe: each thread reads its element before writing it.
#include <cstdint>
#include <string>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/kernels/elementwise/CudaParts.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/elementwise/Contract.h"
#include "runtime/kernels/elementwise/SelectIndex.h"
#include "support/DType.h"
#include "support/Shape.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

template <typename Word>
__global__ void selectKernel(const uint8_t* condition, const Word* onTrue, const Word* onFalse, Word* y,
                             select::BroadcastMap map, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t conditionAt = select::offsetOf(map, 0, i);
    DGEMMA_CUDA_BOUNDS(conditionAt, map.counts[0]);
    const int side = condition[conditionAt] != 0 ? 1 : 2;
    const int64_t at = select::offsetOf(map, side, i);
    DGEMMA_CUDA_BOUNDS(at, map.counts[side]);
    y[i] = side == 1 ? onTrue[at] : onFalse[at];
  }
}

class SelectCudaKernel final : public Kernel {
 public:
  SelectCudaKernel(select::BroadcastMap map, int64_t count, size_t elementSize)
      : map_(map), count_(count), elementSize_(elementSize) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    if (count_ == 0) return;
    cuda::withElementWord(elementSize_, [&](auto word) { launch<decltype(word)>(context, inputs, outputs); });
  }

 private:
  template <typename Word>
  void launch(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) {
    selectKernel<<<cuda::gridFor(static_cast<uint64_t>(count_), kThreads), kThreads, 0,
                   cuda::streamState(context).stream>>>(inputs[0].as<const uint8_t>(), inputs[1].as<const Word>(),
                                                        inputs[2].as<const Word>(), outputs[0].as<Word>(), map_, count_);
    DGEMMA_CUDA_CHECK_LAUNCH("selectKernel");
  }

  select::BroadcastMap map_;
  int64_t count_;
  size_t elementSize_;
};

std::unique_ptr<Kernel> createSelectCudaKernel(const KernelSignature& signature) {
  const SelectContract contract = parseSelectContract(signature);
  select::BroadcastMap map;
  if (!select::makeBroadcastMap({signature.inputs[0]->shape, signature.inputs[1]->shape, signature.inputs[2]->shape},
                                contract.shape, map))
    failSignature(signature, "output y " + shapeToString(contract.shape) + ": the CUDA select maps at most " +
                                 std::to_string(select::BroadcastMap::kMaxRank) + " dims of size above 1");
  return std::make_unique<SelectCudaKernel>(map, numElementsOf(contract.shape), dtypeSize(contract.dtype));
}

}  // namespace

void registerSelectCudaKernels(KernelRegistry& registry) { registry.add("select", createSelectCudaKernel); }

}  // namespace dgemma
