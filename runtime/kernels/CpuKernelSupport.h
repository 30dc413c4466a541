// Shared by the CPU kernel groups (runtime/kernels/<group>/cpu.cpp): the serial fallback for parallel loops, a strided walk over row-major index spaces (broadcasting,
// transposes and reductions all read one tensor in another tensor's order), the gelu_tanh formula
// that more than one kernel evaluates, and lane-parallel max, sum and dot-product loops.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "runtime/kernel_api/Kernel.h"
#include "runtime/core/HostTensor.h"
#include "runtime/core/ThreadPool.h"
#include "runtime/kernels/FastMath.h"

namespace dgemma::cpu {

// Elements per parallel chunk: large enough that scheduling a chunk costs little next to running it.
inline constexpr int64_t kElementGrain = int64_t{1} << 14;

// Rows per chunk for kernels that work row by row, so that a chunk holds about kElementGrain elements.
inline int64_t rowGrain(int64_t rowLength) {
  return std::max<int64_t>(1, kElementGrain / std::max<int64_t>(1, rowLength));
}

// Runs body over [0, count) on the context's threads, or serially when the backend gave none.
// Check inputs before the loop: a body that throws stops the remaining chunks, and the exception
// reaches the caller only after the started chunks have finished.
inline void parallelFor(const ExecContext& context, int64_t count, int64_t grain,
                        const std::function<void(int64_t, int64_t)>& body) {
  if (count <= 0) return;
  if (context.threads != nullptr)
    context.threads->parallelFor(count, grain, body);
  else
    body(0, count);
}

// A byte copy split across the context's threads (copy, reshape, same-dtype cast). The planner may
// hand the same memory as source and destination, which leaves nothing to do.
inline void copyBytes(const ExecContext& context, void* destination, const void* source, uint64_t bytes) {
  if (destination == source) return;
  constexpr int64_t kByteGrain = int64_t{1} << 18;
  parallelFor(context, static_cast<int64_t>(bytes), kByteGrain, [&](int64_t begin, int64_t end) {
    std::memcpy(static_cast<uint8_t*>(destination) + begin, static_cast<const uint8_t*>(source) + begin,
                static_cast<size_t>(end - begin));
  });
}

// gelu_tanh as docs/kernels.md defines it: 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). One definition
// for the elementwise kernel and the MoE experts, so the two round the same way in every dtype. The
// tanh is fastTanh: f32 loops over it vectorise, f64 keeps libm's.
template <typename T>
inline T geluTanh(T x) {
  const T sqrtTwoOverPi = static_cast<T>(0.79788456080286535587989211986876);  // sqrt(2 / pi)
  const T inner = sqrtTwoOverPi * (x + static_cast<T>(0.044715) * x * x * x);
  return static_cast<T>(0.5) * x * (T(1) + fastTanh(inner));
}

// max(x[0, count)) in eight running maxima, so the loop maps onto SIMD lanes: the same value in any
// order (up to the sign of a zero max). Always inlined, so it compiles for its caller's target (the
// AVX2 clones of canvas_sample and softmax).
template <typename T>
[[gnu::always_inline]] inline T laneMaximum(const T* x, int64_t count) {
  constexpr int64_t kLanes = 8;
  T lanes[kLanes];
  std::fill(lanes, lanes + kLanes, -std::numeric_limits<T>::infinity());
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] = std::max(lanes[lane], x[i + lane]);
  for (; i < count; ++i) lanes[0] = std::max(lanes[0], x[i]);
  return *std::max_element(lanes, lanes + kLanes);
}

// Σ x[0, count) in eight running sums, added in lane order at the end, so that the loop maps onto
// SIMD lanes. Always inlined, so it compiles for its caller's target.
template <typename T>
[[gnu::always_inline]] inline T laneSum(const T* x, int64_t count) {
  constexpr int64_t kLanes = 8;
  T lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane] += x[i + lane];
  for (; i < count; ++i) lanes[0] += x[i];
  T sum = 0;
  for (int64_t lane = 0; lane < kLanes; ++lane) sum += lanes[lane];
  return sum;
}

// Σ a[i]·b[i] in eight interleaved partial sums. A single running sum is a chain the compiler may
// not reorder (floating-point addition is not associative), so it stays scalar; eight independent
// ones map onto SIMD lanes. The rounding differs from the sequential sum by the usual O(n·ε).
template <typename T>
inline T dotProduct(const T* a, const T* b, int64_t n) {
  constexpr int64_t kLanes = 8;
  T partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t lane = 0; lane < kLanes; ++lane) partial[lane] += a[i + lane] * b[i + lane];
  for (; i < n; ++i) partial[0] += a[i] * b[i];
  T sum = 0;
  for (int64_t lane = 0; lane < kLanes; ++lane) sum += partial[lane];
  return sum;
}

inline std::vector<int64_t> rowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t d = shape.size(); d-- > 1;) strides[d - 1] = strides[d] * shape[d];
  return strides;
}

// Walks the flat row-major indices of `shape` while tracking, for each of N operands, the element
// offset sum(coord[d] * strides[k][d]). Moving by whole runs along the last dimension keeps the
// per-element work in the callers' inner loops to one multiply-add per operand.
template <size_t N>
class StridedCursor {
 public:
  StridedCursor(std::vector<int64_t> shape, std::array<std::vector<int64_t>, N> strides)
      : shape_(std::move(shape)), strides_(std::move(strides)), coord_(shape_.size(), 0) {}

  // Positions the cursor at flat index `index`; the shape must have no zero dimension.
  void seek(int64_t index) {
    offsets_.fill(0);
    for (size_t d = shape_.size(); d-- > 0;) {
      coord_[d] = index % shape_[d];
      index /= shape_[d];
      for (size_t k = 0; k < N; ++k) offsets_[k] += coord_[d] * strides_[k][d];
    }
  }

  // How many elements remain in the current run along the last dimension.
  int64_t runLength() const { return shape_.empty() ? 1 : shape_.back() - coord_.back(); }
  // The step between consecutive elements of a run, for operand k.
  int64_t innerStride(size_t k) const { return shape_.empty() ? 0 : strides_[k].back(); }
  const std::array<int64_t, N>& offsets() const { return offsets_; }

  // Moves `length` (at most runLength()) elements forward.
  void advance(int64_t length) {
    if (shape_.empty()) return;
    const size_t last = shape_.size() - 1;
    coord_[last] += length;
    for (size_t k = 0; k < N; ++k) offsets_[k] += length * strides_[k][last];
    for (size_t d = last; d > 0 && coord_[d] == shape_[d]; --d) {
      coord_[d] = 0;
      ++coord_[d - 1];
      for (size_t k = 0; k < N; ++k) offsets_[k] += strides_[k][d - 1] - shape_[d] * strides_[k][d];
    }
  }

  // Calls body(flatIndex, offsets, length) for each run that covers [begin, end).
  template <typename Body>
  void forEachRun(int64_t begin, int64_t end, Body&& body) {
    if (begin >= end) return;
    seek(begin);
    for (int64_t index = begin; index < end;) {
      const int64_t length = std::min(end - index, runLength());
      body(index, offsets_, length);
      advance(length);
      index += length;
    }
  }

 private:
  std::vector<int64_t> shape_;
  std::array<std::vector<int64_t>, N> strides_;
  std::vector<int64_t> coord_;
  std::array<int64_t, N> offsets_{};
};

}  // namespace dgemma::cpu
