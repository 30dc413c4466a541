// transpose's index map (docs/kernels.md): element `index` of y (row-major) reads x at
// sourceOffset(map, index), y's index decomposed over y's dims (last fastest), each weighted by x's
// stride of the dim it came from (x's stride of perm[k] for y's dim k). Used by the CUDA kernel
// (cuda.cu) and checked on the host against the CPU kernel by test/unit/kernels/
// TransposeIndexTest.cpp. Plain C++ when not compiled by nvcc.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::layout {

struct TransposeMap {
  static constexpr int kMaxRank = 8;
  int rank = 0;
  int64_t sizes[kMaxRank] = {};        // y's dims
  int64_t readStrides[kMaxRank] = {};  // x's stride of the dim each came from
};

// False when y has more than kMaxRank dims of size above 1 (size-1 dims are dropped: they move
// nothing).
inline bool makeTransposeMap(const std::vector<int64_t>& inputShape, const std::vector<int64_t>& perm,
                             TransposeMap& map) {
  std::vector<int64_t> strides(inputShape.size(), 1);
  for (size_t d = inputShape.size(); d-- > 1;) strides[d - 1] = strides[d] * inputShape[d];
  map = TransposeMap{};
  for (int64_t from : perm) {
    if (inputShape[from] == 1) continue;
    if (map.rank == TransposeMap::kMaxRank) return false;
    map.sizes[map.rank] = inputShape[from];
    map.readStrides[map.rank] = strides[from];
    ++map.rank;
  }
  return true;
}

DGEMMA_HOST_DEVICE inline int64_t sourceOffset(const TransposeMap& map, int64_t index) {
  int64_t offset = 0;
  for (int d = map.rank - 1; d >= 0; --d) {
    offset += (index % map.sizes[d]) * map.readStrides[d];
    index /= map.sizes[d];
  }
  return offset;
}

}  // namespace dgemma::layout
