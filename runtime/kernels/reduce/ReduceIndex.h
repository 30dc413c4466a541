// The index maps and the max step of reduce_sum / reduce_max / reduce_mean (docs/kernels.md), shared
// by the CPU kernel (cpu.cpp: the max step) and the CUDA kernel (cuda.cu: both), and checked on the
// host against the CPU kernel by test/unit/kernels/ReduceIndexTest.cpp. Output element o reads x at
// keptOffset(o) + reducedOffset(r) for every reduced position r; a position is decomposed into the
// dims' indices last dim fastest (row-major), each weighted by x's stride of that dim. Plain C++ when
// not compiled by nvcc.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernels/reduce/Contract.h"

#include "runtime/kernels/HostDevice.h"

namespace dgemma::reduce {

// One side (kept or reduced) of x's dims: sizes and x's strides, adjacent dims that are contiguous in
// x merged (so a reduction over the trailing dims has one reduced dim of stride 1).
struct DimWalk {
  static constexpr int kMaxRank = 8;
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
  int64_t strides[kMaxRank] = {};
  int64_t count = 1;  // the product of the sizes
};

DGEMMA_HOST_DEVICE inline int64_t offsetOf(const DimWalk& walk, int64_t position) {
  int64_t offset = 0;
  for (int d = walk.rank - 1; d >= 0; --d) {
    offset += (position % walk.sizes[d]) * walk.strides[d];
    position /= walk.sizes[d];
  }
  return offset;
}

struct ReduceGeometry {
  DimWalk kept, reduced;
};

// The walks over x's kept and reduced dims; rank is 0 with count 1 for an empty side. Returns false
// when a side needs more than DimWalk::kMaxRank dims after merging.
inline bool makeReduceGeometry(const std::vector<int64_t>& xShape, const ReduceContract& contract,
                               ReduceGeometry& geometry) {
  std::vector<int64_t> strides(xShape.size(), 1);
  for (size_t d = xShape.size(); d-- > 1;) strides[d - 1] = strides[d] * xShape[d];
  auto build = [&](const std::vector<int64_t>& dims, DimWalk& walk) {
    walk = DimWalk{};
    for (int64_t d : dims) {
      walk.count *= xShape[d];
      if (xShape[d] == 1) continue;  // contributes nothing to any offset
      if (walk.rank > 0 && walk.strides[walk.rank - 1] == xShape[d] * strides[d]) {
        walk.sizes[walk.rank - 1] *= xShape[d];  // contiguous with the previous dim: one dim
        walk.strides[walk.rank - 1] = strides[d];
        continue;
      }
      if (walk.rank == DimWalk::kMaxRank) return false;
      walk.sizes[walk.rank] = xShape[d];
      walk.strides[walk.rank] = strides[d];
      ++walk.rank;
    }
    return true;
  };
  return build(contract.keptDims, geometry.kept) && build(contract.reducedDims, geometry.reduced);
}

// reduce_max's step: NaN wins (as in `maximum`), otherwise the larger value.
template <typename T>
DGEMMA_HOST_DEVICE inline T maxStep(T value, T x) {
  return (x != x || x > value) ? x : value;
}

}  // namespace dgemma::reduce
