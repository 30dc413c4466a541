// rope: rotary position embedding in the rotate-half layout, optionally partial (only the first
// rotated_pairs pairs turn; Gemma 4's full layers rotate 64 of 256 pairs).
#include <cmath>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

namespace dgemma {
namespace {

struct RopeGeometry {
  int64_t positions = 0;  // B * T: every head of one (b, t) turns by the same angles
  int64_t heads = 0;
  int64_t headDim = 0;
  int64_t rotatedPairs = 0;
};

// T is the precision of the angles too: the contract computes them in the data's float type, as the
// reference model computes f32 angles for f32 activations.
template <typename T>
class RopeKernel final : public Kernel {
 public:
  RopeKernel(RopeGeometry geometry, std::vector<T> frequencies, bool inverse)
      : geometry_(geometry), frequencies_(std::move(frequencies)), inverse_(inverse) {}

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
          sines[i] = inverse_ ? -std::sin(angle) : std::sin(angle);  // sin(-a) = -sin(a) exactly
        }
        for (int64_t head = 0; head < heads; ++head) {
          const T* xHead = x + (row * heads + head) * headDim;
          T* yHead = y + (row * heads + head) * headDim;
          // Both elements of a pair are read before either is written, so y may alias x.
          for (int64_t i = 0; i < rotated; ++i) {
            const T first = xHead[i], second = xHead[i + half];
            yHead[i] = first * cosines[i] - second * sines[i];
            yHead[i + half] = second * cosines[i] + first * sines[i];
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
  RopeGeometry geometry_;
  std::vector<T> frequencies_;  // f_i for the rotated pairs i < rotatedPairs
  bool inverse_;                // rotate by -angle (the transpose)
};

// f_i = 1 / theta^(2i / frequency_dim), every step in T, as the contract and the reference model
// compute it (an f32 exponent and an f32 power for f32 data).
template <typename T>
std::vector<T> ropeFrequencies(double theta, int64_t rotatedPairs, int64_t frequencyDim) {
  std::vector<T> frequencies(rotatedPairs);
  for (int64_t i = 0; i < rotatedPairs; ++i)
    frequencies[i] =
        T(1) / std::pow(static_cast<T>(theta), static_cast<T>(2 * i) / static_cast<T>(frequencyDim));
  return frequencies;
}

std::unique_ptr<Kernel> createRope(const KernelSignature& signature) {
  expectArity(signature, 2, 1);
  const Buffer& x = *signature.inputs[0];
  const Buffer& positions = *signature.inputs[1];
  const Buffer& y = *signature.outputs[0];
  cpu::expectFloat(signature, x, "input x");
  expectDType(signature, positions, {DType::I64}, "input positions");
  expectDType(signature, y, {x.dtype}, "output y");
  if (x.shape.size() != 4)
    failSignature(signature, "input x has shape " + shapeToString(x.shape) + ", expected [B, T, H, D]");
  cpu::expectShape(signature, positions, {x.shape[0], x.shape[1]}, "input positions");
  cpu::expectShape(signature, y, x.shape, "output y");
  const int64_t headDim = x.shape[3];
  if (headDim % 2 != 0)
    failSignature(signature, "input x has head dim D=" + std::to_string(headDim) +
                                 "; the rotate-half layout needs an even D");

  const double theta = attrDouble(signature, "theta");
  if (!(theta > 0.0) || !std::isfinite(theta))
    failSignature(signature, "attribute 'theta': expected a positive finite number, got " + std::to_string(theta));
  const int64_t rotatedPairs = attrInt(signature, "rotated_pairs");
  if (rotatedPairs < 1 || rotatedPairs > headDim / 2)
    failSignature(signature, "attribute 'rotated_pairs': " + std::to_string(rotatedPairs) + " is outside [1, D/2 = " +
                                 std::to_string(headDim / 2) + "]");
  const int64_t frequencyDim = attrInt(signature, "frequency_dim");
  if (frequencyDim < 1)
    failSignature(signature, "attribute 'frequency_dim': expected a positive integer, got " +
                                 std::to_string(frequencyDim));

  const RopeGeometry geometry{x.shape[0] * x.shape[1], x.shape[2], headDim, rotatedPairs};
  const bool inverse = attrBool(signature, "inverse", false);
  if (x.dtype == DType::F64)
    return std::make_unique<RopeKernel<double>>(geometry, ropeFrequencies<double>(theta, rotatedPairs, frequencyDim), inverse);
  return std::make_unique<RopeKernel<float>>(geometry, ropeFrequencies<float>(theta, rotatedPairs, frequencyDim), inverse);
}

}  // namespace

void registerRopeCpuKernels(KernelRegistry& registry) { registry.add("rope", createRope); }

}  // namespace dgemma
