// random_uniform: Philox4x32-10 uniforms in [0, 1), a pure function of (key, stream, element index).
#include "runtime/core/Philox.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

class RandomUniformKernel final : public Kernel {
 public:
  explicit RandomUniformKernel(uint64_t stream) : stream_(stream) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const int64_t* key = inputs[0].as<const int64_t>();
    const uint64_t seed = static_cast<uint64_t>(key[0]);
    const uint64_t offset = static_cast<uint64_t>(key[1]);
    float* y = outputs[0].as<float>();
    const int64_t count = outputs[0].numElements();
    // One Philox block serves four consecutive elements, so the parallel loop runs over blocks.
    const int64_t blocks = (count + 3) / 4;
    cpu::parallelFor(context, blocks, cpu::kElementGrain / 4, [&](int64_t begin, int64_t end) {
      for (int64_t block = begin; block < end; ++block) {
        const PhiloxCounter words = philoxUniformBlock(seed, stream_, offset, static_cast<uint64_t>(block));
        const int64_t first = block * 4;
        const int64_t last = std::min(first + 4, count);
        for (int64_t i = first; i < last; ++i) y[i] = philoxWordToUniform(words[i - first]);
      }
    });
  }

 private:
  uint64_t stream_;
};

std::unique_ptr<Kernel> createRandomUniform(const KernelSignature& signature) {
  expectArity(signature, 1, 1);
  const Buffer& key = *signature.inputs[0];
  expectDType(signature, key, {DType::I64}, "input key");
  cpu::expectShape(signature, key, {2}, "input key");
  expectDType(signature, *signature.outputs[0], {DType::F32}, "output y");
  const int64_t stream = attrInt(signature, "stream");
  // The stream is XORed into one 32-bit counter word; larger values would alias smaller ones.
  if (stream < 0 || stream > int64_t{0xffffffff})
    failSignature(signature, "attribute 'stream': expected an integer in [0, 2^32), got " + std::to_string(stream));
  return std::make_unique<RandomUniformKernel>(static_cast<uint64_t>(stream));
}

}  // namespace

void registerRandomCpuKernels(KernelRegistry& registry) { registry.add("random_uniform", createRandomUniform); }

}  // namespace dgemma
