// random_uniform and random_int: Philox4x32-10 draws, pure functions of (key, stream, element index).
// A [2] key serves the whole output; an [N, 2] key serves row n of an [N, ...] output with key[n],
// its element indices counted from 0 within the row.
#include <optional>

#include "runtime/core/Philox.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/random/Contract.h"

namespace dgemma {
namespace {

// Calls draw(flatIndex, word, seed, offset, index) for every output element, with its Philox word
// and its index within its key's stream. One Philox block serves four consecutive elements of a row,
// so the parallel loop runs over (row, block) pairs.
template <typename Draw>
void forEachWord(const ExecContext& context, const int64_t* keys, StreamRows layout, uint64_t stream, Draw&& draw) {
  const int64_t blocksPerRow = (layout.rowLength + 3) / 4;
  cpu::parallelFor(context, layout.rows * blocksPerRow, cpu::kElementGrain / 4, [&](int64_t begin, int64_t end) {
    for (int64_t unit = begin; unit < end; ++unit) {
      const int64_t row = unit / blocksPerRow, block = unit % blocksPerRow;
      const uint64_t seed = static_cast<uint64_t>(keys[2 * row]);
      const uint64_t offset = static_cast<uint64_t>(keys[2 * row + 1]);
      const PhiloxCounter words = philoxUniformBlock(seed, stream, offset, static_cast<uint64_t>(block));
      const int64_t first = block * 4;
      const int64_t last = std::min(first + 4, layout.rowLength);
      for (int64_t i = first; i < last; ++i)
        draw(row * layout.rowLength + i, words[i - first], seed, offset, static_cast<uint64_t>(i));
    }
  });
}

class RandomUniformKernel final : public Kernel {
 public:
  RandomUniformKernel(uint64_t stream, StreamRows layout) : stream_(stream), layout_(layout) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    float* y = outputs[0].as<float>();
    forEachWord(context, inputs[0].as<const int64_t>(), layout_, stream_,
                [&](int64_t flat, uint32_t word, uint64_t, uint64_t, uint64_t) { y[flat] = philoxWordToUniform(word); });
  }

 private:
  uint64_t stream_;
  StreamRows layout_;
};

class RandomIntKernel final : public Kernel {
 public:
  RandomIntKernel(uint64_t stream, uint64_t high, StreamRows layout) : stream_(stream), high_(high), layout_(layout) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    int64_t* y = outputs[0].as<int64_t>();
    forEachWord(context, inputs[0].as<const int64_t>(), layout_, stream_,
                [&](int64_t flat, uint32_t word, uint64_t seed, uint64_t offset, uint64_t index) {
                  const std::optional<uint32_t> value = philoxWordToInt(word, high_);
                  // A rejected first word (rare) takes the documented retries.
                  y[flat] = value ? *value : philoxInt(seed, stream_, offset, index, high_);
                });
  }

 private:
  uint64_t stream_;
  uint64_t high_;
  StreamRows layout_;
};

std::unique_ptr<Kernel> createRandomUniformKernel(const KernelSignature& signature) {
  const RandomContract contract = parseRandomUniformContract(signature);
  return std::make_unique<RandomUniformKernel>(contract.stream, contract.layout);
}

std::unique_ptr<Kernel> createRandomIntKernel(const KernelSignature& signature) {
  const RandomContract contract = parseRandomIntContract(signature);
  return std::make_unique<RandomIntKernel>(contract.stream, contract.high, contract.layout);
}

}  // namespace

void registerRandomCpuKernels(KernelRegistry& registry) {
  registry.add("random_uniform", createRandomUniformKernel);
  registry.add("random_int", createRandomIntKernel);
}

}  // namespace dgemma
