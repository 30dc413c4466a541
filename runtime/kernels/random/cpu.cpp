// random_uniform and random_int: Philox4x32-10 draws, pure functions of (key, stream, element index).
// A [2] key serves the whole output; an [N, 2] key serves row n of an [N, ...] output with key[n],
// its element indices counted from 0 within the row.
#include <optional>

#include "runtime/core/Philox.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

// How the output splits into streams: `rows` keys of (seed, offset), each serving `rowLength`
// consecutive elements.
struct StreamRows {
  int64_t rows = 1;
  int64_t rowLength = 0;
};

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

// The key is [2] (one stream) or [N, 2] (one per row of an [N, ...] output).
StreamRows checkKeys(const KernelSignature& signature) {
  const Buffer& key = *signature.inputs[0];
  const Buffer& y = *signature.outputs[0];
  expectDType(signature, key, {DType::I64}, "input key");
  const int64_t count = y.numElements();
  if (key.shape == std::vector<int64_t>{2}) return {1, count};
  if (key.shape.size() != 2 || key.shape[1] != 2)
    failSignature(signature, "input key has shape " + shapeToString(key.shape) + ", expected [2] or [N, 2]");
  if (y.shape.empty() || y.shape[0] != key.shape[0])
    failSignature(signature, "output y has shape " + shapeToString(y.shape) + ", expected [" +
                                 std::to_string(key.shape[0]) + ", ...] (one row per key)");
  return {key.shape[0], key.shape[0] == 0 ? 0 : count / key.shape[0]};
}

uint64_t checkStream(const KernelSignature& signature) {
  const int64_t stream = attrInt(signature, "stream");
  // The stream is XORed into one 32-bit counter word; larger values would alias smaller ones.
  if (stream < 0 || stream > int64_t{0xffffffff})
    failSignature(signature, "attribute 'stream': expected an integer in [0, 2^32), got " + std::to_string(stream));
  return static_cast<uint64_t>(stream);
}

std::unique_ptr<Kernel> createRandomUniform(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  expectDType(signature, *signature.outputs[0], {DType::F32}, "output y");
  const StreamRows layout = checkKeys(signature);
  return std::make_unique<RandomUniformKernel>(checkStream(signature), layout);
}

std::unique_ptr<Kernel> createRandomInt(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  expectDType(signature, *signature.outputs[0], {DType::I64}, "output y");
  const StreamRows layout = checkKeys(signature);
  const uint64_t stream = checkStream(signature);
  const int64_t high = attrInt(signature, "high");
  // Each element comes from one 32-bit word.
  if (high < 1 || high > (int64_t{1} << 32))
    failSignature(signature, "attribute 'high': expected an integer in [1, 2^32], got " + std::to_string(high));
  return std::make_unique<RandomIntKernel>(stream, static_cast<uint64_t>(high), layout);
}

}  // namespace

void registerRandomCpuKernels(KernelRegistry& registry) {
  registry.add("random_uniform", createRandomUniform);
  registry.add("random_int", createRandomInt);
}

}  // namespace dgemma
