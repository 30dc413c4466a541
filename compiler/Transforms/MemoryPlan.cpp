#include "compiler/Transforms/Passes.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGMEMORYPLAN
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

struct Interval {
  Value root;
  int64_t first = 0;
  int64_t last = 0;
  int64_t bytes = 0;
  int64_t offset = -1;
};

struct DgMemoryPlanPass : mlir::dg::impl::DgMemoryPlanBase<DgMemoryPlanPass> {
  using DgMemoryPlanBase::DgMemoryPlanBase;

  void runOnOperation() override {
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
      getOperation().emitError() << "dg-memory-plan: alignment must be a power of two";
      return signalPassFailure();
    }
    getOperation().walk([&](func::FuncOp function) {
      if (function->hasAttr(kEntryAttr)) planFunction(function);
    });
  }

  void planFunction(func::FuncOp function) {
    Block& body = function.getBody().front();
    const int64_t end = std::distance(body.begin(), body.end());

    // Lifetimes over op positions in the block, gathered per storage root.
    llvm::MapVector<Value, Interval> intervals;
    int64_t position = 0;
    for (Operation& op : body) {
      for (Value result : op.getResults()) {
        Value root = storageRoot(result);
        if (isPersistentStorage(root)) continue;
        Interval& interval = intervals[root];
        if (!interval.root) {
          interval.root = root;
          interval.first = isa<InputOp>(op) ? 0 : position;
          interval.last = interval.first;
          interval.bytes = storageBytes(cast<RankedTensorType>(root.getType()));
        }
      }
      for (Value operand : op.getOperands()) {
        auto it = intervals.find(storageRoot(operand));
        if (it == intervals.end()) continue;
        it->second.last = std::max(it->second.last, isa<OutputOp>(op) ? end : position);
      }
      ++position;
    }

    // Largest first, each at the lowest aligned offset clear of every placed, overlapping value.
    SmallVector<Interval*> order;
    for (auto& entry : intervals) order.push_back(&entry.second);
    llvm::stable_sort(order, [](const Interval* a, const Interval* b) { return a->bytes > b->bytes; });
    SmallVector<Interval*> placed;
    int64_t arenaBytes = 0;
    for (Interval* interval : order) {
      SmallVector<std::pair<int64_t, int64_t>> busy;  // byte ranges of overlapping placed values
      for (Interval* other : placed)
        if (other->first <= interval->last && interval->first <= other->last)
          busy.push_back({other->offset, other->offset + other->bytes});
      llvm::sort(busy);
      int64_t candidate = 0;
      for (auto [begin, finish] : busy) {
        if (candidate + interval->bytes <= begin) break;
        candidate = std::max(candidate, alignTo(finish));
      }
      interval->offset = candidate;
      placed.push_back(interval);
      arenaBytes = std::max(arenaBytes, candidate + interval->bytes);
    }

    Builder builder(function.getContext());
    for (Operation& op : body) {
      if (op.getNumResults() == 0) continue;
      // -1 marks a result stored in a parameter (an in-place update); an op with no scratch result
      // (a param, a constant) gets no offsets.
      SmallVector<int64_t> offsets;
      bool anyScratch = false;
      for (Value result : op.getResults()) {
        auto it = intervals.find(storageRoot(result));
        offsets.push_back(it == intervals.end() ? -1 : it->second.offset);
        anyScratch |= it != intervals.end();
      }
      if (anyScratch) op.setAttr(kOffsetsAttr, builder.getDenseI64ArrayAttr(offsets));
    }
    function->setAttr(kScratchBytesAttr, builder.getI64IntegerAttr(alignTo(arenaBytes)));
  }

  int64_t alignTo(int64_t value) const { return (value + alignment - 1) / alignment * alignment; }
};

}  // namespace
