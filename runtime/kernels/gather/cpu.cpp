// gather: rows of a [V, H] table selected by integer ids (embedding lookup).
// scatter_add: its adjoint, rows added into a [V, H] table of zeros at the ids, except at skip_id.
#include <cstring>
#include <optional>

#include "support/Error.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/gather/Contract.h"

namespace dgemma {
namespace {

template <typename Id>
class GatherKernel final : public Kernel {
 public:
  GatherKernel(std::string where, int64_t vocabulary, uint64_t rowBytes)
      : where_(std::move(where)), vocabulary_(vocabulary), rowBytes_(rowBytes) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const uint8_t* table = inputs[0].as<const uint8_t>();
    const Id* ids = inputs[1].as<const Id>();
    uint8_t* y = outputs[0].as<uint8_t>();
    const int64_t count = inputs[1].numElements();
    // Checked up front and serially: the thread pool cannot carry an exception out of a worker.
    for (int64_t i = 0; i < count; ++i)
      if (ids[i] < 0 || ids[i] >= vocabulary_)
        throw RuntimeError(where_ + ": id " + std::to_string(ids[i]) + " at flat index " + std::to_string(i) +
                           " is outside the table's rows [0, " + std::to_string(vocabulary_) + ")");
    cpu::parallelFor(context, count, cpu::rowGrain(static_cast<int64_t>(rowBytes_)), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        std::memcpy(y + i * rowBytes_, table + static_cast<int64_t>(ids[i]) * rowBytes_, rowBytes_);
    });
  }

 private:
  std::string where_;  // run-time errors name the step as the plan loader does
  int64_t vocabulary_;
  uint64_t rowBytes_;
};

std::unique_ptr<Kernel> createGatherKernel(const KernelSignature& signature) {
  const GatherContract c = parseGatherContract(signature);
  const uint64_t rowBytes = static_cast<uint64_t>(c.width) * dtypeSize(c.dtype);
  if (c.idsDtype == DType::I32) return std::make_unique<GatherKernel<int32_t>>(signature.where, c.vocabulary, rowBytes);
  return std::make_unique<GatherKernel<int64_t>>(signature.where, c.vocabulary, rowBytes);
}

// Serial over the ids, so rows hit by several ids add up in id order whatever the thread count; the
// rows themselves are short, and V·H zeroing dominates for an embedding table.
template <typename T, typename Id>
class ScatterAddKernel final : public Kernel {
 public:
  ScatterAddKernel(std::string where, int64_t vocabulary, int64_t width, std::optional<int64_t> skipId)
      : where_(std::move(where)), vocabulary_(vocabulary), width_(width), skipId_(skipId) {}

  void run(ExecContext&, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const Id* ids = inputs[0].as<const Id>();
    const T* updates = inputs[1].as<const T>();
    T* table = outputs[0].as<T>();
    const int64_t count = inputs[0].numElements();
    for (int64_t i = 0; i < count; ++i)
      if (ids[i] < 0 || ids[i] >= vocabulary_)
        throw RuntimeError(where_ + ": id " + std::to_string(static_cast<int64_t>(ids[i])) + " at flat index " +
                           std::to_string(i) + " is outside the table's rows [0, " + std::to_string(vocabulary_) + ")");
    std::fill(table, table + vocabulary_ * width_, T(0));
    for (int64_t i = 0; i < count; ++i) {
      if (skipId_ == ids[i]) continue;
      T* row = table + static_cast<int64_t>(ids[i]) * width_;
      const T* update = updates + i * width_;
      for (int64_t h = 0; h < width_; ++h) row[h] += update[h];
    }
  }

 private:
  std::string where_;
  int64_t vocabulary_, width_;
  std::optional<int64_t> skipId_;  // the row no position adds into (a gather's padding_idx)
};

std::unique_ptr<Kernel> createScatterAddKernel(const KernelSignature& signature) {
  const GatherContract c = parseScatterAddContract(signature, {DType::F32, DType::F64});
  const std::string& where = signature.where;
  if (c.dtype == DType::F64) {
    if (c.idsDtype == DType::I64)
      return std::make_unique<ScatterAddKernel<double, int64_t>>(where, c.vocabulary, c.width, c.skipId);
    return std::make_unique<ScatterAddKernel<double, int32_t>>(where, c.vocabulary, c.width, c.skipId);
  }
  if (c.idsDtype == DType::I64)
    return std::make_unique<ScatterAddKernel<float, int64_t>>(where, c.vocabulary, c.width, c.skipId);
  return std::make_unique<ScatterAddKernel<float, int32_t>>(where, c.vocabulary, c.width, c.skipId);
}

}  // namespace

void registerGatherCpuKernels(KernelRegistry& registry) {
  registry.add("gather", createGatherKernel);
  registry.add("scatter_add", createScatterAddKernel);
}

}  // namespace dgemma
