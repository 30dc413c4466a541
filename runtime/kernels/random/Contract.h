// The contracts of random_uniform (f32 in [0, 1)) and random_int (i64 in [0, high)), parsed once for
// every backend (docs/kernels.md): one input key of i64, [2] for the whole output or [N, 2] for the
// rows of an [N, ...] output; attribute `stream` in [0, 2^32), and `high` in [1, 2^32] for random_int.
#pragma once

#include <cstdint>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// How the output splits into streams: `rows` keys of (seed, offset), each serving `rowLength`
// consecutive elements.
struct StreamRows {
  int64_t rows = 1;
  int64_t rowLength = 0;
};

struct RandomContract {
  StreamRows layout;
  uint64_t stream = 0;
  uint64_t high = 0;  // random_int only
};

// Both throw InputError for anything their contract does not admit.
RandomContract parseRandomUniformContract(const KernelSignature& signature);
RandomContract parseRandomIntContract(const KernelSignature& signature);

}  // namespace dgemma
