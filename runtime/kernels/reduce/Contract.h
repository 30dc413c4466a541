// The contract of reduce_sum, reduce_max and reduce_mean (docs/kernels.md), parsed once for every
// backend: x -> y over attribute `dims` (distinct, increasing), y keeping them as 1s when `keep_dims`.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "runtime/kernel_api/Kernel.h"

namespace dgemma {

// x's dims split into the kept ones (y's elements, in order) and the reduced ones.
struct ReduceContract {
  DType dtype = DType::F32;
  std::vector<int64_t> keptDims, reducedDims;  // indices into x's shape, increasing
};

// Throws InputError for anything the contract does not admit; `dtypes` are the element types the
// calling backend implements.
ReduceContract parseReduceContract(const KernelSignature& signature, std::initializer_list<DType> dtypes);

}  // namespace dgemma
