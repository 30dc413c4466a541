// Which local row of a block of the table an id reaches, for gather and scatter_add (docs/kernels.md),
// shared by the CPU kernels (cpu.cpp) and the CUDA kernels (cuda.cu), and checked on the host against
// the CPU kernels by test/unit/kernels/GatherRowMapTest.cpp. The table holds the global rows
// [rowOffset, rowOffset + vocabulary). Plain C++ when not compiled by nvcc.
#pragma once

#include <cstdint>

#include "runtime/kernels/HostDevice.h"

namespace dgemma::gather {

constexpr int64_t kNoRow = -1;

// The local row of a global id, or kNoRow when the id lies outside the block (a negative id too: the
// CPU kernels reject those before, the CUDA kernels read a zero row for them and add nothing).
DGEMMA_HOST_DEVICE inline int64_t localRowOf(int64_t id, int64_t rowOffset, int64_t vocabulary) {
  const int64_t row = id - rowOffset;
  return row < 0 || row >= vocabulary ? kNoRow : row;
}

// scatter_add's row for an id: kNoRow also for skip_id (hasSkip), whose row no position adds into.
DGEMMA_HOST_DEVICE inline int64_t scatterRowOf(int64_t id, bool hasSkip, int64_t skipId, int64_t rowOffset,
                                               int64_t vocabulary) {
  return hasSkip && id == skipId ? kNoRow : localRowOf(id, rowOffset, vocabulary);
}

}  // namespace dgemma::gather
