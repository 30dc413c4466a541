// random_uniform and random_int on CUDA (docs/kernels.md, "Random numbers"); runtime/kernels/random/
// cpu.cpp is their CPU twin. Both call the one constexpr Philox of runtime/core/Philox.h (built with
// --expt-relaxed-constexpr, see CMakeLists.txt), so every element is the CPU kernel's bit for bit:
// the stream is a pure function of (seed, stream, offset, index), with no state to diverge.
//
// One thread per Philox block of a row (four consecutive elements of one key's stream), grid-stride
// over the (row, block) pairs; the thread writes the block's elements that lie inside the row.
#include <cstdint>

#include "runtime/backends/cuda/CudaCommon.h"
#include "runtime/core/Philox.h"
#include "runtime/kernels/CudaKernels.h"
#include "runtime/kernels/KernelElements.h"
#include "runtime/kernels/random/Contract.h"

namespace dgemma {
namespace {

constexpr unsigned kThreads = 256;

struct UniformDraw {
  __device__ float operator()(uint32_t word, uint64_t, uint64_t, uint64_t, uint64_t) const {
    return philoxWordToUniform(word);
  }
};

struct IntDraw {
  uint64_t high;
  __device__ int64_t operator()(uint32_t word, uint64_t seed, uint64_t stream, uint64_t offset, uint64_t index) const {
    // A rejected first word (rare) takes the documented retries under offset + 1, + 2, ...
    const std::optional<uint32_t> value = philoxWordToInt(word, high);
    return value ? *value : philoxInt(seed, stream, offset, index, high);
  }
};

template <typename Out, typename Draw>
__global__ void randomKernel(const int64_t* keys, Out* y, uint64_t stream, int64_t rows, int64_t rowLength, Draw draw) {
  const int64_t blocksPerRow = (rowLength + 3) / 4;
  for (int64_t unit = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; unit < rows * blocksPerRow;
       unit += int64_t(gridDim.x) * blockDim.x) {
    const int64_t row = unit / blocksPerRow, block = unit % blocksPerRow;
    DGEMMA_CUDA_BOUNDS(2 * row + 1, 2 * rows);
    const uint64_t seed = static_cast<uint64_t>(keys[2 * row]), offset = static_cast<uint64_t>(keys[2 * row + 1]);
    const PhiloxCounter words = philoxUniformBlock(seed, stream, offset, static_cast<uint64_t>(block));
    for (int64_t i = block * 4; i < block * 4 + 4 && i < rowLength; ++i) {
      DGEMMA_CUDA_BOUNDS(row * rowLength + i, rows * rowLength);
      y[row * rowLength + i] = draw(words[i - block * 4], seed, stream, offset, static_cast<uint64_t>(i));
    }
  }
}

template <typename Out, typename Draw>
class RandomCudaKernel final : public Kernel {
 public:
  RandomCudaKernel(RandomContract contract, Draw draw) : c_(contract), draw_(draw) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t units = c_.layout.rows * ((c_.layout.rowLength + 3) / 4);
    if (units == 0) return;
    cudaStream_t stream = cuda::streamState(context).stream;
    randomKernel<<<cuda::gridFor(static_cast<uint64_t>(units), kThreads), kThreads, 0, stream>>>(
        inputs[0].as<const int64_t>(), outputs[0].as<Out>(), c_.stream, c_.layout.rows, c_.layout.rowLength, draw_);
    DGEMMA_CUDA_CHECK_LAUNCH("randomKernel");
  }

 private:
  RandomContract c_;
  Draw draw_;
};

std::unique_ptr<Kernel> createRandomUniformCudaKernel(const KernelSignature& signature) {
  return std::make_unique<RandomCudaKernel<float, UniformDraw>>(parseRandomUniformContract(signature), UniformDraw{});
}

std::unique_ptr<Kernel> createRandomIntCudaKernel(const KernelSignature& signature) {
  const RandomContract contract = parseRandomIntContract(signature);
  return std::make_unique<RandomCudaKernel<int64_t, IntDraw>>(contract, IntDraw{contract.high});
}

}  // namespace

void registerRandomCudaKernels(KernelRegistry& registry) {
  registry.add("random_uniform", createRandomUniformCudaKernel);
  registry.add("random_int", createRandomIntCudaKernel);
}

}  // namespace dgemma
