// reduce_sum, reduce_max, reduce_mean over a sorted list of dimensions.
#include <cmath>
#include <limits>
#include <type_traits>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"

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
      value = (std::isnan(x) || x > value) ? x : value;  // NaN wins, as in maximum
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
void addReduction(KernelRegistry& registry, const std::string& name) {
  registry.add(name, [](const KernelSignature& signature) -> std::unique_ptr<Kernel> {
    expectArity(signature, 1, 1);
    const Buffer& x = *signature.inputs[0];
    const Buffer& y = *signature.outputs[0];
    cpu::expectFloat(signature, x, "input x");
    expectDType(signature, y, {x.dtype}, "output y");
    const std::vector<int64_t> dims = attrInts(signature, "dims");
    const bool keepDims = attrBool(signature, "keep_dims", false);

    const int64_t rank = static_cast<int64_t>(x.shape.size());
    for (size_t i = 0; i < dims.size(); ++i)
      if (dims[i] < 0 || dims[i] >= rank || (i > 0 && dims[i] <= dims[i - 1]))
        failSignature(signature, "attribute 'dims': expected distinct dimensions of input x " +
                                     shapeToString(x.shape) + " in increasing order, got " + shapeToString(dims));

    const std::vector<int64_t> xStrides = cpu::rowMajorStrides(x.shape);
    std::vector<int64_t> keptShape, keptStrides, reducedShape, reducedStrides, expected;
    size_t nextReduced = 0;
    for (int64_t d = 0; d < rank; ++d) {
      if (nextReduced < dims.size() && dims[nextReduced] == d) {
        ++nextReduced;
        reducedShape.push_back(x.shape[d]);
        reducedStrides.push_back(xStrides[d]);
        if (keepDims) expected.push_back(1);
      } else {
        keptShape.push_back(x.shape[d]);
        keptStrides.push_back(xStrides[d]);
        expected.push_back(x.shape[d]);
      }
    }
    cpu::expectShape(signature, y, expected, "output y");

    const int64_t outputCount = numElementsOf(keptShape), reducedCount = numElementsOf(reducedShape);
    cpu::StridedCursor<1> kept(keptShape, {keptStrides});
    cpu::StridedCursor<1> reduced(reducedShape, {reducedStrides});
    if (x.dtype == DType::F64)
      return std::make_unique<ReduceKernel<double, kind>>(std::move(kept), outputCount, std::move(reduced),
                                                          reducedCount);
    return std::make_unique<ReduceKernel<float, kind>>(std::move(kept), outputCount, std::move(reduced), reducedCount);
  });
}

}  // namespace

void registerReduceCpuKernels(KernelRegistry& registry) {
  addReduction<Reduction::Sum>(registry, "reduce_sum");
  addReduction<Reduction::Max>(registry, "reduce_max");
  addReduction<Reduction::Mean>(registry, "reduce_mean");
}

}  // namespace dgemma
