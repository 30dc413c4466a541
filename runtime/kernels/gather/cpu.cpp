// gather: rows of a [V, H] table selected by integer ids (embedding lookup).
// scatter_add: its adjoint, rows added into a [V, H] table of zeros at the ids, except at skip_id.
// Both tables may be one block of a larger one, the global rows [row_offset, row_offset + V): an id
// outside the block reads a zero row or adds nothing (a vocab-parallel embedding, docs/kernels.md).
#include <cstring>

#include "support/Error.h"
#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/gather/Contract.h"
#include "runtime/kernels/gather/RowMap.h"

namespace dgemma {
namespace {

// No table holds a negative row, so such an id is a bad input whatever block this rank holds. Checked
// up front and serially: the thread pool cannot carry an exception out of a worker.
template <typename Id>
void checkIdsAreRows(const std::string& where, const Id* ids, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    if (ids[i] < 0)
      throw RuntimeError(where + ": id " + std::to_string(static_cast<int64_t>(ids[i])) + " at flat index " +
                         std::to_string(i) + " is negative, not a row of the table");
}

template <typename Id>
class GatherKernel final : public Kernel {
 public:
  GatherKernel(std::string where, GatherContract block)
      : where_(std::move(where)), block_(block), rowBytes_(static_cast<uint64_t>(block.width) * dtypeSize(block.dtype)) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const uint8_t* table = inputs[0].as<const uint8_t>();
    const Id* ids = inputs[1].as<const Id>();
    uint8_t* y = outputs[0].as<uint8_t>();
    const int64_t count = inputs[1].numElements();
    checkIdsAreRows(where_, ids, count);
    // All-zero bytes are the value 0 in every dtype the table may have.
    cpu::parallelFor(context, count, cpu::rowGrain(static_cast<int64_t>(rowBytes_)), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        if (const int64_t row = gather::localRowOf(ids[i], block_.rowOffset, block_.vocabulary); row != gather::kNoRow)
          std::memcpy(y + i * rowBytes_, table + row * rowBytes_, rowBytes_);
        else
          std::memset(y + i * rowBytes_, 0, rowBytes_);
      }
    });
  }

 private:
  std::string where_;  // run-time errors name the step as the plan loader does
  GatherContract block_;
  uint64_t rowBytes_;
};

std::unique_ptr<Kernel> createGatherKernel(const KernelSignature& signature) {
  const GatherContract c = parseGatherContract(signature);
  if (c.idsDtype == DType::I32) return std::make_unique<GatherKernel<int32_t>>(signature.where, c);
  return std::make_unique<GatherKernel<int64_t>>(signature.where, c);
}

// Serial over the ids, so rows hit by several ids add up in id order whatever the thread count; the
// rows themselves are short, and V·H zeroing dominates for an embedding table.
template <typename T, typename Id>
class ScatterAddKernel final : public Kernel {
 public:
  ScatterAddKernel(std::string where, GatherContract block) : where_(std::move(where)), block_(block) {}

  void run(ExecContext&, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const Id* ids = inputs[0].as<const Id>();
    const T* updates = inputs[1].as<const T>();
    T* table = outputs[0].as<T>();
    const int64_t count = inputs[0].numElements(), width = block_.width;
    checkIdsAreRows(where_, ids, count);
    std::fill(table, table + block_.vocabulary * width, T(0));
    for (int64_t i = 0; i < count; ++i) {
      const int64_t row =
          gather::scatterRowOf(ids[i], block_.skipId.has_value(), block_.skipId.value_or(0), block_.rowOffset,
                               block_.vocabulary);
      if (row == gather::kNoRow) continue;
      T* target = table + row * width;
      const T* update = updates + i * width;
      for (int64_t h = 0; h < width; ++h) target[h] += update[h];
    }
  }

 private:
  std::string where_;
  GatherContract block_;  // skipId: the row no position adds into (a gather's padding_idx)
};

std::unique_ptr<Kernel> createScatterAddKernel(const KernelSignature& signature) {
  const GatherContract c = parseScatterAddContract(signature, {DType::F32, DType::F64});
  const std::string& where = signature.where;
  if (c.dtype == DType::F64) {
    if (c.idsDtype == DType::I64) return std::make_unique<ScatterAddKernel<double, int64_t>>(where, c);
    return std::make_unique<ScatterAddKernel<double, int32_t>>(where, c);
  }
  if (c.idsDtype == DType::I64) return std::make_unique<ScatterAddKernel<float, int64_t>>(where, c);
  return std::make_unique<ScatterAddKernel<float, int32_t>>(where, c);
}

}  // namespace

void registerGatherCpuKernels(KernelRegistry& registry) {
  registry.add("gather", createGatherKernel);
  registry.add("scatter_add", createScatterAddKernel);
}

}  // namespace dgemma
