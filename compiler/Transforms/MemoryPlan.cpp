#include "compiler/Transforms/MemoryPlan.h"

#include <algorithm>
#include <map>
#include <queue>
#include <set>

#include "compiler/Transforms/Passes.h"
#include "llvm/ADT/MapVector.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGMEMORYPLAN
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

enum class Pool { Activations, Communication };

// One storage root's lifetime [first, last] over op positions, inclusive: a value read by the op
// that defines another overlaps it.
struct Interval {
  Value root;
  Pool pool = Pool::Activations;
  int64_t first = 0;
  int64_t last = 0;
  int64_t bytes = 0;  // rounded up to the alignment
  int64_t offset = -1;
};

// The byte ranges of placed intervals, found by time overlap. Only the union of the ranges that a
// new interval overlaps decides its offset, so the index keeps unions: a segment tree over op
// positions whose nodes each hold a coalesced set of byte ranges. Tree `covering` holds an
// interval's range in the nodes that cover its lifetime exactly (the nodes on the path to a
// position hold every interval alive there); tree `starting` holds it in every node whose span
// contains its first position (the canonical nodes of (a, b] hold every interval that starts
// there). An interval overlapping [a, b] either contains a or starts in (a, b]. Values placed
// largest first pack densely, so the unions stay a few ranges where the intervals are thousands.
class PlacedRanges {
 public:
  explicit PlacedRanges(int64_t positions)
      : positions_(std::max<int64_t>(positions, 1)), covering_(4 * positions_), starting_(4 * positions_) {}

  void insert(const Interval& interval) {
    insertCovering(1, 0, positions_ - 1, interval);
    int64_t node = 1, low = 0, high = positions_ - 1;
    for (;;) {
      addRange(starting_[node], interval.offset, interval.offset + interval.bytes);
      if (low == high) break;
      int64_t middle = (low + high) / 2;
      if (interval.first <= middle) {
        node = 2 * node;
        high = middle;
      } else {
        node = 2 * node + 1;
        low = middle + 1;
      }
    }
  }

  // Appends to `busy` byte ranges whose union is that of every placed interval overlapping [first, last].
  void collect(int64_t first, int64_t last, std::vector<std::pair<int64_t, int64_t>>& busy) const {
    int64_t node = 1, low = 0, high = positions_ - 1;
    for (;;) {
      busy.insert(busy.end(), covering_[node].begin(), covering_[node].end());
      if (low == high) break;
      int64_t middle = (low + high) / 2;
      if (first <= middle) {
        node = 2 * node;
        high = middle;
      } else {
        node = 2 * node + 1;
        low = middle + 1;
      }
    }
    if (first < last) collectStarting(1, 0, positions_ - 1, first + 1, last, busy);
  }

 private:
  using Ranges = std::map<int64_t, int64_t>;  // begin -> end, disjoint and not touching

  static void addRange(Ranges& ranges, int64_t begin, int64_t end) {
    auto it = ranges.upper_bound(begin);
    if (it != ranges.begin() && std::prev(it)->second >= begin) {
      --it;
      begin = it->first;
      end = std::max(end, it->second);
      it = ranges.erase(it);
    }
    while (it != ranges.end() && it->first <= end) {
      end = std::max(end, it->second);
      it = ranges.erase(it);
    }
    ranges.emplace_hint(it, begin, end);
  }

  void insertCovering(int64_t node, int64_t low, int64_t high, const Interval& interval) {
    if (interval.last < low || high < interval.first) return;
    if (interval.first <= low && high <= interval.last) {
      addRange(covering_[node], interval.offset, interval.offset + interval.bytes);
      return;
    }
    int64_t middle = (low + high) / 2;
    insertCovering(2 * node, low, middle, interval);
    insertCovering(2 * node + 1, middle + 1, high, interval);
  }

  void collectStarting(int64_t node, int64_t low, int64_t high, int64_t first, int64_t last,
                       std::vector<std::pair<int64_t, int64_t>>& busy) const {
    if (last < low || high < first || starting_[node].empty()) return;
    if (first <= low && high <= last) {
      busy.insert(busy.end(), starting_[node].begin(), starting_[node].end());
      return;
    }
    int64_t middle = (low + high) / 2;
    collectStarting(2 * node, low, middle, first, last, busy);
    collectStarting(2 * node + 1, middle + 1, high, first, last, busy);
  }

  int64_t positions_;
  std::vector<Ranges> covering_;
  std::vector<Ranges> starting_;
};

// Largest first, each at the lowest aligned offset clear of every placed value it overlaps in
// time. Returns the arena size; leaves each interval's offset.
int64_t packLargestFirst(ArrayRef<Interval*> intervals, int64_t positions) {
  SmallVector<Interval*> order(intervals.begin(), intervals.end());
  llvm::stable_sort(order, [](const Interval* a, const Interval* b) { return a->bytes > b->bytes; });
  PlacedRanges placed(positions);
  int64_t arenaBytes = 0;
  std::vector<std::pair<int64_t, int64_t>> busy;  // byte ranges covering every overlapping placed value
  for (Interval* interval : order) {
    busy.clear();
    placed.collect(interval->first, interval->last, busy);
    std::sort(busy.begin(), busy.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    int64_t candidate = 0;
    for (auto [begin, finish] : busy) {
      if (candidate + interval->bytes <= begin) break;
      candidate = std::max(candidate, finish);
    }
    interval->offset = candidate;
    placed.insert(*interval);
    arenaBytes = std::max(arenaBytes, candidate + interval->bytes);
  }
  return arenaBytes;
}

// In program order (larger first among values born at the same op), each into the smallest free
// block that holds it, else at the end of the arena (growing a free block that ends there). Blocks
// are freed after their last use and merge with free neighbours. Returns the arena size.
int64_t packBestFit(ArrayRef<Interval*> intervals) {
  SmallVector<Interval*> order(intervals.begin(), intervals.end());
  llvm::stable_sort(order, [](const Interval* a, const Interval* b) {
    return a->first != b->first ? a->first < b->first : a->bytes > b->bytes;
  });
  std::map<int64_t, int64_t> freeByOffset;            // offset -> bytes
  std::set<std::pair<int64_t, int64_t>> freeBySize;   // (bytes, offset)
  auto addFree = [&](int64_t offset, int64_t bytes) {
    auto next = freeByOffset.lower_bound(offset);
    if (next != freeByOffset.end() && next->first == offset + bytes) {
      bytes += next->second;
      freeBySize.erase({next->second, next->first});
      next = freeByOffset.erase(next);
    }
    if (next != freeByOffset.begin()) {
      auto previous = std::prev(next);
      if (previous->first + previous->second == offset) {
        offset = previous->first;
        bytes += previous->second;
        freeBySize.erase({previous->second, previous->first});
        freeByOffset.erase(previous);
      }
    }
    freeByOffset[offset] = bytes;
    freeBySize.insert({bytes, offset});
  };
  auto removeFree = [&](int64_t offset, int64_t bytes) {
    freeByOffset.erase(offset);
    freeBySize.erase({bytes, offset});
  };

  using Ending = std::pair<int64_t, Interval*>;  // (last, interval), earliest first
  std::priority_queue<Ending, std::vector<Ending>, std::greater<>> live;
  int64_t end = 0;  // the arena's size so far
  for (Interval* interval : order) {
    while (!live.empty() && live.top().first < interval->first) {
      addFree(live.top().second->offset, live.top().second->bytes);
      live.pop();
    }
    auto fit = freeBySize.lower_bound({interval->bytes, 0});
    if (fit != freeBySize.end()) {
      auto [bytes, offset] = *fit;
      removeFree(offset, bytes);
      interval->offset = offset;
      if (bytes > interval->bytes) addFree(offset + interval->bytes, bytes - interval->bytes);
    } else if (!freeByOffset.empty() && std::prev(freeByOffset.end())->first + std::prev(freeByOffset.end())->second == end) {
      auto [offset, bytes] = *std::prev(freeByOffset.end());
      removeFree(offset, bytes);
      interval->offset = offset;
      end = offset + interval->bytes;
    } else {
      interval->offset = end;
      end += interval->bytes;
    }
    live.push({interval->last, interval});
  }
  return end;
}

// The most bytes live at one op position.
int64_t maxLiveBytes(ArrayRef<Interval*> intervals) {
  std::map<int64_t, int64_t> change;  // position -> bytes born minus bytes freed there
  for (const Interval* interval : intervals) {
    change[interval->first] += interval->bytes;
    change[interval->last + 1] -= interval->bytes;
  }
  int64_t live = 0, most = 0;
  for (auto [position, delta] : change) most = std::max(most, live += delta);
  return most;
}

// Packs one pool both ways and leaves the smaller packing's offsets in the intervals.
PoolPacking packPool(ArrayRef<Interval*> intervals, int64_t positions) {
  PoolPacking packing;
  packing.values = static_cast<int64_t>(intervals.size());
  packing.maxLiveBytes = maxLiveBytes(intervals);
  packing.bestFitBytes = packBestFit(intervals);
  std::vector<int64_t> bestFitOffsets;
  for (const Interval* interval : intervals) bestFitOffsets.push_back(interval->offset);
  packing.largestFirstBytes = packLargestFirst(intervals, positions);
  if (packing.bestFitBytes < packing.largestFirstBytes)
    for (auto [interval, offset] : llvm::zip(intervals, bestFitOffsets)) interval->offset = offset;
  return packing;
}

// Moves each parameter update `%p = dg.param; %v = op(%p, ...); dg.assign %v to %p` up to just
// after the last of op's other operands, when nothing else in the entry reads or writes %p and %v
// has no other use. dg-gradient-buffers appends a training step's buffer updates at the end of the
// entry, so every weight gradient stayed live from the layer's backward to the end; moved, each
// dies where it is added into its buffer. No value changes: the parameter's bytes are read by that
// op alone, and the param op, which has no operands, moves with it.
void scheduleUpdatesEarly(func::FuncOp function) {
  Block& body = function.getBody().front();
  llvm::DenseMap<Operation*, int64_t> position;
  int64_t index = 0;
  for (Operation& op : body) position[&op] = index++;
  SmallVector<AssignOp> assigns(body.getOps<AssignOp>());
  for (AssignOp assign : assigns) {
    Operation* update = assign.getValue().getDefiningOp();
    Value target = assign.getTarget();
    auto param = target.getDefiningOp<ParamOp>();
    if (!update || !param || update->getBlock() != &body || param->getBlock() != &body ||
        !assign.getValue().hasOneUse() || update->getNumResults() != 1)
      continue;
    // A collective keeps its place: every rank must issue its collectives in one order, and whether
    // an update may move depends on the rank's own program (a rank whose share of a pending sum is
    // zeros does not read the buffer it reduces into; docs/parallelism.md, "Tensor parallelism
    // beyond the KV heads").
    if (isa<CommunicationOpInterface>(update)) continue;
    if (llvm::any_of(target.getUsers(), [&](Operation* user) { return user != update && user != assign.getOperation(); }))
      continue;
    Operation* lastOperand = nullptr;
    bool movable = true;
    for (Value operand : update->getOperands()) {
      if (operand == target) continue;
      Operation* producer = operand.getDefiningOp();
      if (!producer || producer->getBlock() != &body) {
        movable = false;
        break;
      }
      if (!lastOperand || position.lookup(producer) > position.lookup(lastOperand)) lastOperand = producer;
    }
    if (!movable || !lastOperand || position.lookup(lastOperand) + 1 >= position.lookup(update)) continue;
    param->moveAfter(lastOperand);
    update->moveAfter(param);
    assign->moveAfter(update);
  }
}

int64_t alignTo(int64_t value, int64_t alignment) { return (value + alignment - 1) / alignment * alignment; }

struct DgMemoryPlanPass : mlir::dg::impl::DgMemoryPlanBase<DgMemoryPlanPass> {
  using DgMemoryPlanBase::DgMemoryPlanBase;
  explicit DgMemoryPlanPass(MemoryPlanObserver observe) : observe_(std::move(observe)) {}

  void runOnOperation() override {
    if (alignment <= 0 || (alignment & (alignment - 1)) != 0) {
      getOperation().emitError() << "dg-memory-plan: alignment must be a power of two";
      return signalPassFailure();
    }
    func::FuncOp function = getOperation();
    if (!function->hasAttr(kEntryAttr)) return;
    scheduleUpdatesEarly(function);
    EntryMemoryPlan plan = planEntryMemory(function, alignment, /*write=*/true);
    if (observe_) observe_(function, plan);
    if (!stats) return;
    InFlightDiagnostic remark = function.emitRemark() << "memory plan:";
    auto print = [&](const char* name, const PoolPacking& pool) {
      char fragmentation[16];
      std::snprintf(fragmentation, sizeof fragmentation, "%.3f", pool.fragmentation());
      remark << " " << name << " values=" << pool.values << " bytes=" << pool.plannedBytes()
             << " largest_first=" << pool.largestFirstBytes << " best_fit=" << pool.bestFitBytes
             << " max_live=" << pool.maxLiveBytes << " fragmentation=" << std::string(fragmentation) << ";";
    };
    print("activations", plan.activations);
    print("communication", plan.communication);
  }

  MemoryPlanObserver observe_;
};

}  // namespace

std::unique_ptr<Pass> mlir::dg::createDgMemoryPlanObserved(MemoryPlanObserver observe) {
  return std::make_unique<DgMemoryPlanPass>(std::move(observe));
}

EntryMemoryPlan mlir::dg::planEntryMemory(func::FuncOp function, int64_t alignment, bool write) {
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
        interval.pool = isCommunicationBuffer(root) ? Pool::Communication : Pool::Activations;
        interval.first = isa<InputOp>(op) ? 0 : position;
        interval.last = interval.first;
        interval.bytes = alignTo(storageBytes(cast<RankedTensorType>(root.getType())), alignment);
      }
    }
    for (Value operand : op.getOperands()) {
      auto it = intervals.find(storageRoot(operand));
      if (it == intervals.end()) continue;
      it->second.last = std::max(it->second.last, isa<OutputOp>(op) ? end : position);
    }
    ++position;
  }

  SmallVector<Interval*> activations, communication;
  for (auto& entry : intervals)
    (entry.second.pool == Pool::Communication ? communication : activations).push_back(&entry.second);
  EntryMemoryPlan plan;
  plan.activations = packPool(activations, end + 1);
  plan.communication = packPool(communication, end + 1);
  if (!write) return plan;

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
  function->setAttr(kScratchBytesAttr, builder.getI64IntegerAttr(plan.activations.plannedBytes()));
  function->setAttr(kCommBufferBytesAttr, builder.getI64IntegerAttr(plan.communication.plannedBytes()));
  return plan;
}
