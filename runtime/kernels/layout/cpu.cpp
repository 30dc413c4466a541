// transpose, reshape, concat and slice: data movement only, for any dtype.
#include <cstring>

#include "runtime/kernels/CpuKernelSupport.h"
#include "runtime/kernels/CpuKernels.h"
#include "runtime/kernels/layout/Contract.h"

namespace dgemma {
namespace {

// Walks y in order and reads x through permuted strides: writes stay sequential, reads jump.
// `Word` is an unsigned integer of the element's size; moving bits is all a transpose does.
template <typename Word>
class TransposeKernel final : public Kernel {
 public:
  explicit TransposeKernel(cpu::StridedCursor<1> cursor, int64_t count) : cursor_(std::move(cursor)), count_(count) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const Word* x = inputs[0].as<const Word>();
    Word* y = outputs[0].as<Word>();
    const int64_t stride = cursor_.innerStride(0);
    cpu::parallelFor(context, count_, cpu::kElementGrain, [&](int64_t begin, int64_t end) {
      cpu::StridedCursor<1> cursor = cursor_;
      cursor.forEachRun(begin, end, [&](int64_t index, const std::array<int64_t, 1>& offsets, int64_t length) {
        const Word* source = x + offsets[0];
        for (int64_t k = 0; k < length; ++k) y[index + k] = source[k * stride];
      });
    });
  }

 private:
  cpu::StridedCursor<1> cursor_;
  int64_t count_;
};

// The common case of a swap of the last two dims, y[b, j, i] = x[b, i, j] for x [batch, rows, cols]
// (the tied embedding's [V, H] -> [H, V] among them). Walking y in order there reads one element per
// cache line of x, and a [256, 16384] f32 transpose ran at a few hundred MB/s; square tiles keep
// both the reads and the writes of a tile within a few cache lines and pages.
template <typename Word>
class MatrixTransposeKernel final : public Kernel {
 public:
  MatrixTransposeKernel(int64_t batch, int64_t rows, int64_t cols) : batch_(batch), rows_(rows), cols_(cols) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const Word* x = inputs[0].as<const Word>();
    Word* y = outputs[0].as<Word>();
    constexpr int64_t kTile = 32;
    const int64_t rows = rows_, cols = cols_;
    const int64_t rowTiles = (rows + kTile - 1) / kTile;
    // One task per (matrix, band of kTile rows of x); each band covers kTile·cols elements.
    cpu::parallelFor(context, batch_ * rowTiles, cpu::rowGrain(kTile * cols), [&](int64_t begin, int64_t end) {
      for (int64_t task = begin; task < end; ++task) {
        const int64_t matrix = task / rowTiles;
        const int64_t firstRow = (task % rowTiles) * kTile, lastRow = std::min(rows, firstRow + kTile);
        const Word* source = x + matrix * rows * cols;
        Word* destination = y + matrix * rows * cols;
        for (int64_t firstCol = 0; firstCol < cols; firstCol += kTile) {
          const int64_t lastCol = std::min(cols, firstCol + kTile);
          for (int64_t col = firstCol; col < lastCol; ++col)
            for (int64_t row = firstRow; row < lastRow; ++row) destination[col * rows + row] = source[row * cols + col];
        }
      }
    });
  }

 private:
  int64_t batch_, rows_, cols_;
};

template <typename Word>
std::unique_ptr<Kernel> transposeKernel(const std::vector<int64_t>& shape, const std::vector<int64_t>& perm,
                                        cpu::StridedCursor<1> cursor, int64_t count) {
  const size_t rank = shape.size();
  bool swapsLastTwo = rank >= 2 && perm[rank - 2] == static_cast<int64_t>(rank - 1) &&
                      perm[rank - 1] == static_cast<int64_t>(rank - 2);
  for (size_t k = 0; swapsLastTwo && k + 2 < rank; ++k) swapsLastTwo = perm[k] == static_cast<int64_t>(k);
  if (swapsLastTwo) {
    const int64_t rows = shape[rank - 2], cols = shape[rank - 1];
    return std::make_unique<MatrixTransposeKernel<Word>>(rows * cols == 0 ? 0 : count / (rows * cols), rows, cols);
  }
  return std::make_unique<TransposeKernel<Word>>(std::move(cursor), count);
}

std::unique_ptr<Kernel> createTransposeKernel(const KernelSignature& signature) {
  const TransposeContract c = parseTransposeContract(signature);
  const std::vector<int64_t> xStrides = cpu::rowMajorStrides(c.inputShape);
  std::vector<int64_t> readStrides(c.perm.size());
  for (size_t k = 0; k < c.perm.size(); ++k) readStrides[k] = xStrides[c.perm[k]];
  cpu::StridedCursor<1> cursor(c.outputShape, {readStrides});
  switch (c.elementBytes) {
    case 1: return transposeKernel<uint8_t>(c.inputShape, c.perm, std::move(cursor), c.count);
    case 2: return transposeKernel<uint16_t>(c.inputShape, c.perm, std::move(cursor), c.count);
    case 4: return transposeKernel<uint32_t>(c.inputShape, c.perm, std::move(cursor), c.count);
    default: return transposeKernel<uint64_t>(c.inputShape, c.perm, std::move(cursor), c.count);
  }
}

class ReshapeKernel final : public Kernel {
 public:
  explicit ReshapeKernel(uint64_t bytes) : bytes_(bytes) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    cpu::copyBytes(context, outputs[0].data, inputs[0].data, bytes_);
  }

 private:
  uint64_t bytes_;
};

std::unique_ptr<Kernel> createReshapeKernel(const KernelSignature& signature) {
  return std::make_unique<ReshapeKernel>(parseReshapeContract(signature).bytes);
}

// Row-major concatenation along `dim`: for each index of the leading dims, every input contributes
// one contiguous block, in order.
class ConcatKernel final : public Kernel {
 public:
  ConcatKernel(int64_t outerCount, std::vector<uint64_t> blockBytes)
      : outerCount_(outerCount), blockBytes_(std::move(blockBytes)) {
    for (uint64_t bytes : blockBytes_) rowBytes_ += bytes;
  }

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    uint8_t* y = outputs[0].as<uint8_t>();
    cpu::parallelFor(context, outerCount_, cpu::rowGrain(static_cast<int64_t>(rowBytes_)), [&](int64_t begin, int64_t end) {
      for (int64_t outer = begin; outer < end; ++outer) {
        uint8_t* row = y + outer * rowBytes_;
        for (size_t i = 0; i < inputs.size(); ++i) {
          std::memcpy(row, inputs[i].as<const uint8_t>() + outer * blockBytes_[i], blockBytes_[i]);
          row += blockBytes_[i];
        }
      }
    });
  }

 private:
  int64_t outerCount_;
  std::vector<uint64_t> blockBytes_;
  uint64_t rowBytes_ = 0;
};

std::unique_ptr<Kernel> createConcatKernel(const KernelSignature& signature) {
  ConcatContract c = parseConcatContract(signature);
  return std::make_unique<ConcatKernel>(c.outerCount, std::move(c.blockBytes));
}

// The block [start, start + size) of `dim`: for each index of the leading dims, one contiguous copy.
class SliceKernel final : public Kernel {
 public:
  SliceKernel(int64_t outerCount, uint64_t inputRowBytes, uint64_t offsetBytes, uint64_t outputRowBytes)
      : outerCount_(outerCount), inputRowBytes_(inputRowBytes), offsetBytes_(offsetBytes), outputRowBytes_(outputRowBytes) {}

  void run(ExecContext& context, const std::vector<TensorRef>& inputs, const std::vector<TensorRef>& outputs) override {
    const uint8_t* x = inputs[0].as<const uint8_t>();
    uint8_t* y = outputs[0].as<uint8_t>();
    cpu::parallelFor(context, outerCount_, cpu::rowGrain(static_cast<int64_t>(outputRowBytes_)), [&](int64_t begin, int64_t end) {
      for (int64_t outer = begin; outer < end; ++outer)
        std::memcpy(y + outer * outputRowBytes_, x + outer * inputRowBytes_ + offsetBytes_, outputRowBytes_);
    });
  }

 private:
  int64_t outerCount_;
  uint64_t inputRowBytes_, offsetBytes_, outputRowBytes_;
};

std::unique_ptr<Kernel> createSliceKernel(const KernelSignature& signature) {
  const SliceContract c = parseSliceContract(signature);
  return std::make_unique<SliceKernel>(c.outerCount, c.inputRowBytes, c.offsetBytes, c.outputRowBytes);
}

}  // namespace

void registerLayoutCpuKernels(KernelRegistry& registry) {
  const KernelTraits movesBits{.movesBitsOnly = true};
  registry.add("transpose", createTransposeKernel, movesBits);
  registry.add("reshape", createReshapeKernel, movesBits);
  registry.add("concat", createConcatKernel, movesBits);
  registry.add("slice", createSliceKernel, movesBits);
}

}  // namespace dgemma
