// softmax's contract (docs/kernels.md), parsed once for the CPU and the CUDA kernel: y = softmax(x)
// along attribute `axis` (negative counts from the end), y of x's shape and dtype.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// x seen as [outer, length, inner] around the axis: a line is one (outer, inner) pair, its `length`
// elements `inner` apart. For the last axis inner is 1 and lines are contiguous rows.
struct SoftmaxContract {
  DType dtype = DType::F32;
  int64_t axis = 0;           // in [0, rank)
  int64_t requestedAxis = 0;  // as the step wrote it, for error messages
  int64_t rank = 0;
  int64_t outer = 1, length = 0, inner = 1;
};

// Throws InputError for anything the contract does not admit; `dtypes` are the element types the
// calling backend implements.
SoftmaxContract parseSoftmaxContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

}  // namespace dgemma
