// rope's frequencies and pair rotation (docs/kernels.md, "Model kernels"), shared by the CPU kernel (cpu.cpp)
// and the CUDA kernel (cuda.cu). The frequencies are computed on the host by both backends (the CUDA
// kernel gets them as a launch parameter), so they are the same bits; the rotation is four IEEE
// multiplies and two adds, which round alike on both (no FMA contraction on the device). Only the
// cosine and sine come from each side's own math library (libm, libdevice), a few ulp apart. Plain
// C++ when not compiled by nvcc.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::rope {

// f_i = 1 / theta^(2i / frequency_dim) for the rotated pairs i < rotatedPairs, every step in T, as the
// contract and the reference model compute it (an f32 exponent and an f32 power for f32 data).
template <typename T>
std::vector<T> ropeFrequencies(double theta, int64_t rotatedPairs, int64_t frequencyDim) {
  std::vector<T> frequencies(rotatedPairs);
  for (int64_t i = 0; i < rotatedPairs; ++i)
    frequencies[i] = T(1) / std::pow(static_cast<T>(theta), static_cast<T>(2 * i) / static_cast<T>(frequencyDim));
  return frequencies;
}

template <typename T>
struct RotatedPair {
  T first, second;  // y[i], y[i + D/2]
};

// The pair (x[i], x[i + D/2]) turned by the angle whose cosine and sine are given.
template <typename T>
DGEMMA_HOST_DEVICE inline RotatedPair<T> rotatePair(T first, T second, T cosine, T sine) {
  return {first * cosine - second * sine, second * cosine + first * sine};
}

}  // namespace dgemma::rope
