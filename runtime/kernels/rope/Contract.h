// rope's contract (docs/kernels.md), parsed once for every backend: (x [B, T, H, D], positions [B, T]
// of i64) -> y of x's shape and dtype, in the rotate-half layout with an even D; attributes `theta`
// (> 0, finite), `rotated_pairs` (in [1, D/2]), `frequency_dim` (> 0), optional `inverse`.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct RopeContract {
  DType dtype = DType::F32;
  int64_t positions = 0;  // B * T: every head of one (b, t) turns by the same angles
  int64_t heads = 0;
  int64_t headDim = 0;
  int64_t rotatedPairs = 0;
  int64_t frequencyDim = 0;
  double theta = 0;
  bool inverse = false;
};

// Throws InputError for anything the contract does not admit; `dtypes` are the float types the
// calling backend implements.
RopeContract parseRopeContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

}  // namespace dgemma
