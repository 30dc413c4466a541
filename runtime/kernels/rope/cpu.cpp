// rope: rotary position embedding in the rotate-half layout, optionally partial (only the first
// rotated_pairs pairs turn; Gemma 4's full layers rotate 64 of 256 pairs).
#include <cmath>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/rope/Contract.h"
#include "runtime/kernels/rope/RopeMath.h"

namespace dgemma {
namespace {

// T is the precision of the angles too: the contract computes them in the data's float type, as the
// reference model computes f32 angles for f32 activations.
template <typename T>
class RopeKernel final : public Kernel {
 public:
  RopeKernel(RopeContract geometry, std::vector<T> frequencies)
      : geometry_(geometry), frequencies_(std::move(frequencies)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    const int64_t* positions = inputs[1].as<const int64_t>();
    T* y = outputs[0].as<T>();
    const int64_t heads = geometry_.heads, headDim = geometry_.headDim, half = headDim / 2;
    const int64_t rotated = geometry_.rotatedPairs;
    cpu::parallelFor(context, geometry_.positions, cpu::rowGrain(heads * headDim), [&](int64_t begin, int64_t end) {
      std::vector<T> cosines(rotated), sines(rotated);
      for (int64_t row = begin; row < end; ++row) {
        const T position = static_cast<T>(positions[row]);
        for (int64_t i = 0; i < rotated; ++i) {
          const T angle = position * frequencies_[i];
          cosines[i] = std::cos(angle);
          sines[i] = geometry_.inverse ? -std::sin(angle) : std::sin(angle);  // sin(-a) = -sin(a) exactly
        }
        for (int64_t head = 0; head < heads; ++head) {
          const T* xHead = x + (row * heads + head) * headDim;
          T* yHead = y + (row * heads + head) * headDim;
          // Both elements of a pair are read before either is written, so y may alias x.
          for (int64_t i = 0; i < rotated; ++i) {
            const rope::RotatedPair<T> turned = rope::rotatePair(xHead[i], xHead[i + half], cosines[i], sines[i]);
            yHead[i] = turned.first;
            yHead[i + half] = turned.second;
          }
          // Pairs with frequency 0 turn by angle 0. Copying them keeps them bit-exact, where the
          // formula x·1 − x'·0 would turn −0 into +0 and make NaN from an infinite partner.
          for (int64_t i = rotated; i < half; ++i) {
            yHead[i] = xHead[i];
            yHead[i + half] = xHead[i + half];
          }
        }
      }
    });
  }

 private:
  RopeContract geometry_;
  std::vector<T> frequencies_;  // f_i for the rotated pairs i < rotatedPairs
};

std::unique_ptr<Kernel> createRopeKernel(const KernelSignature& signature) {
  const RopeContract c = parseRopeContract(signature, {DType::F32, DType::F64});
  if (c.dtype == DType::F64)
    return std::make_unique<RopeKernel<double>>(c, rope::ropeFrequencies<double>(c.theta, c.rotatedPairs, c.frequencyDim));
  return std::make_unique<RopeKernel<float>>(c, rope::ropeFrequencies<float>(c.theta, c.rotatedPairs, c.frequencyDim));
}

}  // namespace

void registerRopeCpuKernels(KernelRegistry& registry) { registry.add("rope", createRopeKernel); }

}  // namespace dgemma
