// The contracts of the layout kernels (docs/kernels.md), parsed once for every backend. They move
// elements of any dtype; y has x's dtype.
//   transpose {perm}: x -> y, y.shape[k] = x.shape[perm[k]]
//   reshape: x -> y, same element count
//   concat {dim}: (x0, x1, ...) -> y, the inputs agree with y outside `dim`
//   slice {dim, start}: x -> y, y the block [start, start + y.shape[dim]) of `dim`
// The parse functions throw InputError for anything their contract does not admit.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

struct TransposeContract {
  uint64_t elementBytes = 0;
  std::vector<int64_t> inputShape;   // x's
  std::vector<int64_t> perm;         // a permutation of x's dims
  std::vector<int64_t> outputShape;  // y's
  int64_t count = 0;                 // elements
};

TransposeContract parseTransposeContract(const KernelSignature& signature);

struct ReshapeContract {
  uint64_t bytes = 0;  // of x, and of y
};

ReshapeContract parseReshapeContract(const KernelSignature& signature);

// Row-major: for each index of the dims before `dim` (outerCount of them), every input contributes
// one contiguous block of blockBytes[i], in order.
struct ConcatContract {
  int64_t outerCount = 1;
  std::vector<uint64_t> blockBytes;  // one per input
};

ConcatContract parseConcatContract(const KernelSignature& signature);

// For each index of the dims before `dim` (outerCount of them), y's row of outputRowBytes is the part
// of x's row of inputRowBytes that starts offsetBytes in.
struct SliceContract {
  int64_t outerCount = 1;
  uint64_t inputRowBytes = 0, offsetBytes = 0, outputRowBytes = 0;
};

SliceContract parseSliceContract(const KernelSignature& signature);

}  // namespace dgemma
