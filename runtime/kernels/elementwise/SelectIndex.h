// select's broadcast index map (docs/kernels.md, "Core kernels"): output element `index` (row-major) reads
// operand k (condition, on_true, on_false) at offsetOf(map, k, index), the output's index decomposed
// over its dims (last fastest), each weighted by the operand's stride along that dim (0 where the
// operand broadcasts: NumPy rules, shapes aligned on the right). Used by the CUDA kernel (select.cu)
// and checked on the host against the CPU kernel by test/unit/kernels/SelectIndexTest.cpp. Plain C++
// when not compiled by nvcc.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::select {

struct BroadcastMap {
  static constexpr int kMaxRank = 8;
  static constexpr int kOperands = 3;
  int rank = 0;
  int64_t sizes[kMaxRank] = {};
  int64_t strides[kOperands][kMaxRank] = {};
  int64_t counts[kOperands] = {};  // elements of each operand, the extent of the CUDA bounds assertions
};

// The map of the operands' shapes onto the output's; size-1 output dims are dropped (they move
// nothing). False when more than kMaxRank dims remain.
inline bool makeBroadcastMap(const std::vector<std::vector<int64_t>>& operandShapes,
                             const std::vector<int64_t>& outputShape, BroadcastMap& map) {
  map = BroadcastMap{};
  const size_t rank = outputShape.size();
  std::vector<std::vector<int64_t>> strides;
  for (const std::vector<int64_t>& shape : operandShapes) {
    std::vector<int64_t> operandStrides(rank, 0);  // 0: broadcast (or missing) along that dim
    int64_t stride = 1;
    for (size_t fromEnd = 1; fromEnd <= shape.size(); ++fromEnd) {
      const int64_t size = shape[shape.size() - fromEnd];
      if (size != 1) operandStrides[rank - fromEnd] = stride;
      stride *= size;
    }
    map.counts[strides.size()] = stride;
    strides.push_back(operandStrides);
  }
  for (size_t d = 0; d < rank; ++d) {
    if (outputShape[d] == 1) continue;
    if (map.rank == BroadcastMap::kMaxRank) return false;
    map.sizes[map.rank] = outputShape[d];
    for (int k = 0; k < BroadcastMap::kOperands; ++k) map.strides[k][map.rank] = strides[k][d];
    ++map.rank;
  }
  return true;
}

DGEMMA_HOST_DEVICE inline int64_t offsetOf(const BroadcastMap& map, int operand, int64_t index) {
  int64_t offset = 0;
  for (int d = map.rank - 1; d >= 0; --d) {
    offset += (index % map.sizes[d]) * map.strides[operand][d];
    index /= map.sizes[d];
  }
  return offset;
}

}  // namespace dgemma::select
