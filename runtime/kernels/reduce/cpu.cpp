// reduce_sum, reduce_max, reduce_mean over a sorted list of dimensions.
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/reduce/Contract.h"
#include "runtime/kernels/reduce/ReduceIndex.h"

namespace dgemma {
namespace {

enum class Reduction { Sum, Max, Mean };

// Sums accumulate in f64 whatever T is: a loss summed over many tokens in f32 would lose digits, and
// the CPU backend can afford the wider accumulator.
template <typename T, Reduction kind>
struct Accumulator {
  using Value = std::conditional_t<kind == Reduction::Max, T, double>;
  Value value = kind == Reduction::Max ? -std::numeric_limits<T>::infinity() : Value(0);

  void add(T x) {
    if constexpr (kind == Reduction::Max)
      value = reduce::maxStep(value, x);  // NaN wins, as in maximum
    else
      value += x;
  }
  // Folds in an accumulator that saw other elements of the same output.
  void merge(const Accumulator& other) {
    if constexpr (kind == Reduction::Max)
      add(other.value);
    else
      value += other.value;
  }
  T result(int64_t count) const {
    if constexpr (kind == Reduction::Mean) return static_cast<T>(value / static_cast<double>(count));
    return static_cast<T>(value);
  }
};

// Accumulates values[0], values[stride], ... (count of them). A contiguous run goes to eight
// interleaved accumulators: one running f64 sum is a chain of dependent adds, and eight
// independent ones vectorise.
template <typename T, Reduction kind>
void accumulateRun(Accumulator<T, kind>& accumulator, const T* values, int64_t count, int64_t stride) {
  if (stride != 1) {
    for (int64_t j = 0; j < count; ++j) accumulator.add(values[j * stride]);
    return;
  }
  constexpr int64_t kLanes = 8;
  Accumulator<T, kind> lanes[kLanes];
  int64_t j = 0;
  for (; j + kLanes <= count; j += kLanes)
    for (int64_t lane = 0; lane < kLanes; ++lane) lanes[lane].add(values[j + lane]);
  for (; j < count; ++j) lanes[0].add(values[j]);
  for (const Accumulator<T, kind>& lane : lanes) accumulator.merge(lane);
}

// Output element o reads x at keptOffset(o) + reducedOffset(r) for every reduced position r; two
// cursors walk the kept and the reduced dimensions with x's strides. Where consecutive outputs are
// consecutive elements of x (a reduction over leading dims, such as a bias gradient), a run of them
// is accumulated together, reading x one contiguous row at a time instead of one strided column per
// output.
template <typename T, Reduction kind>
class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(cpu::StridedCursor<1> kept, int64_t outputCount, cpu::StridedCursor<1> reduced, int64_t reducedCount)
      : kept_(std::move(kept)), outputCount_(outputCount), reduced_(std::move(reduced)), reducedCount_(reducedCount) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const T* x = inputs[0].as<const T>();
    T* y = outputs[0].as<T>();
    const int64_t keptStride = kept_.innerStride(0), reducedStride = reduced_.innerStride(0);
    cpu::parallelFor(context, outputCount_, cpu::rowGrain(reducedCount_), [&](int64_t begin, int64_t end) {
      cpu::StridedCursor<1> keptCursor = kept_;
      cpu::StridedCursor<1> reducedCursor = reduced_;
      std::vector<Accumulator<T, kind>> row;
      keptCursor.forEachRun(begin, end, [&](int64_t index, const std::array<int64_t, 1>& keptOffsets, int64_t length) {
        if (keptStride == 1 && length > 1) {
          row.assign(length, Accumulator<T, kind>{});
          const T* base = x + keptOffsets[0];
          reducedCursor.forEachRun(0, reducedCount_, [&](int64_t, const std::array<int64_t, 1>& offsets, int64_t run) {
            for (int64_t j = 0; j < run; ++j) {
              const T* values = base + offsets[0] + j * reducedStride;
              for (int64_t k = 0; k < length; ++k) row[k].add(values[k]);
            }
          });
          for (int64_t k = 0; k < length; ++k) y[index + k] = row[k].result(reducedCount_);
          return;
        }
        for (int64_t k = 0; k < length; ++k) {
          const T* base = x + keptOffsets[0] + k * keptStride;
          Accumulator<T, kind> accumulator;
          reducedCursor.forEachRun(0, reducedCount_, [&](int64_t, const std::array<int64_t, 1>& offsets, int64_t run) {
            accumulateRun(accumulator, base + offsets[0], run, reducedStride);
          });
          y[index + k] = accumulator.result(reducedCount_);
        }
      });
    });
  }

 private:
  cpu::StridedCursor<1> kept_;
  int64_t outputCount_;
  cpu::StridedCursor<1> reduced_;
  int64_t reducedCount_;
};

template <Reduction kind>
std::unique_ptr<Kernel> createReduceKernel(const KernelSignature& signature) {
  const ReduceContract c = parseReduceContract(signature, {DType::F32, DType::F64});
  const std::vector<int64_t>& xShape = signature.inputs[0]->shape;
  const std::vector<int64_t> xStrides = cpu::rowMajorStrides(xShape);
  // A cursor over the given dims of x, in x's order.
  auto cursorOver = [&](const std::vector<int64_t>& dims) {
    std::vector<int64_t> shape, strides;
    for (int64_t d : dims) {
      shape.push_back(xShape[d]);
      strides.push_back(xStrides[d]);
    }
    return std::pair{cpu::StridedCursor<1>(shape, {strides}), numElementsOf(shape)};
  };
  auto [kept, outputCount] = cursorOver(c.keptDims);
  auto [reduced, reducedCount] = cursorOver(c.reducedDims);
  if (c.dtype == DType::F64)
    return std::make_unique<ReduceKernel<double, kind>>(std::move(kept), outputCount, std::move(reduced), reducedCount);
  return std::make_unique<ReduceKernel<float, kind>>(std::move(kept), outputCount, std::move(reduced), reducedCount);
}

}  // namespace

void registerReduceCpuKernels(KernelRegistry& registry) {
  registry.add("reduce_sum", createReduceKernel<Reduction::Sum>);
  registry.add("reduce_max", createReduceKernel<Reduction::Max>);
  registry.add("reduce_mean", createReduceKernel<Reduction::Mean>);
}

}  // namespace dgemma
