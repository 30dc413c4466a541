// dg-backward-schedule: reorders the backward pass of each entry point that differentiates a loss so
// that the gradient contributions which meet in a sum are computed close together
// (docs/performance.md, "Scheduling the backward"). No value changes: every op computes what it
// computed before from the same operands; only the order of the ops and a cast's copies change.
#include <queue>
#include <tuple>
#include <vector>

#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgRecompute.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/StringSet.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGBACKWARDSCHEDULE
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

// The parameter whose bytes `value` is, through views (reshape, stop_gradient); null otherwise.
ParamOp parameterBehindViews(Value value) {
  while (Operation* producer = value.getDefiningOp()) {
    if (auto param = dyn_cast<ParamOp>(producer)) return param;
    if (!isa<ReshapeOp, StopGradientOp>(producer)) return nullptr;
    value = producer->getOperand(0);
  }
  return nullptr;
}

// Names of the parameters that a dg.assign in `body` writes.
llvm::StringSet<> assignedParameters(Block& body) {
  llvm::StringSet<> names;
  for (AssignOp assign : body.getOps<AssignOp>())
    if (ParamOp param = parameterBehindViews(assign.getTarget())) names.insert(param.getName());
  return names;
}

// Gives every reader of a cast of a parameter (the bf16 copy of a weight) after the first a copy of
// the cast of its own, made just before it. CSE leaves one cast per weight, which the encoder pass,
// the decoder pass and the backward all read: the encoder reads every layer before the decoder reads
// the first, so each copy would live from its encoder layer to its last backward read, and all the
// model's bf16 weights with it. A cast moves the same bits each time, so every copy equals the
// first. Parameters that the entry writes are left alone (a later cast could read the new value).
// A dg.dequantize of a frozen base weight's codes is such a copy too (docs/training.md, "Frozen
// low-precision base"): each reader decodes its own.
void recastParametersPerUse(Block& body, const llvm::StringSet<>& assigned) {
  SmallVector<Operation*> casts;
  for (Operation& op : body)
    if (isa<CastOp, DequantizeOp>(op))
      if (ParamOp param = parameterBehindViews(op.getOperand(0)); param && !assigned.contains(param.getName()))
        casts.push_back(&op);
  for (Operation* cast : casts) {
    SmallVector<Operation*> users;
    for (Operation* user : cast->getUsers())
      if (!llvm::is_contained(users, user)) users.push_back(user);
    llvm::sort(users, [](Operation* a, Operation* b) { return a->isBeforeInBlock(b); });
    for (Operation* user : llvm::drop_begin(users)) {
      OpBuilder builder(user);
      Operation* copy = builder.clone(*cast);
      user->replaceUsesOfWith(cast->getResult(0), copy->getResult(0));
    }
  }
}

// A dg.assign, or the op whose only use is a dg.assign back into a parameter it reads (a gradient
// buffer's sum), when nothing else reads that parameter. dg-memory-plan moves each such update up to
// its last operand; here they stay at the end, where dg.assign's verifier (no read of a parameter
// after its assignment) scans the least.
bool isParameterUpdate(Operation* op) {
  auto assign = dyn_cast<AssignOp>(op);
  if (!assign) {
    if (op->getNumResults() != 1 || !op->getResult(0).hasOneUse()) return false;
    assign = dyn_cast<AssignOp>(*op->getResult(0).getUsers().begin());
    if (!assign || !llvm::is_contained(op->getOperands(), assign.getTarget())) return false;
  }
  // Nothing else reads the parameter, so nothing waits for the update.
  Operation* update = assign.getValue().getDefiningOp();
  return llvm::all_of(assign.getTarget().getUsers(), [&](Operation* user) { return user == assign || user == update; });
}

// Elements of a tensor value (0 for anything else).
int64_t elements(Value value) {
  auto type = dyn_cast<RankedTensorType>(value.getType());
  return type && type.hasStaticShape() ? type.getNumElements() : 0;
}

// A select whose condition is a compile-time constant passes one side through unchanged: on the
// ranks whose share of a pending sum is zeros, the zeros that still read the value (Reshard.cpp).
// Deferred like a view, it leaves those ranks the schedule of the rank that keeps the value; ordered,
// it added a step to every such chain, the depths moved and the ranks' backwards came out in
// different orders with different peaks (docs/performance.md, "Scheduling the backward").
bool selectsAtCompileTime(Operation* op) {
  auto select = dyn_cast<SelectOp>(op);
  return select && select.getCondition().getDefiningOp<ConstantOp>();
}

// An op whose results hold more than this many times the elements of what it reads from the
// backward (a weight gradient from a few tokens' activations) runs just before its first user.
constexpr int64_t kExpansion = 2;

// The list scheduler over the ops after the loss output (the backward). Each op there is either
// - deferred: it reads nothing the backward computed (a fill, a view or cast of a forward value, a
//   recast parameter), is one of dg-recompute's clones, selects at compile time, or makes much more
//   than it reads (a weight gradient from a few tokens); it runs just before its first user, or
// - ordered: everything else. An ordered op is ready when the ordered ops it depends on (through
//   deferred ops too) have run; among ready ops the least depth (the longest chain of ordered ops
//   from the backward's start, in bands) runs first, then the earlier one in the old order.
// By depth, the encoder pass's backward of a layer runs beside the decoder pass's backward of the
// layer below, as soon as the decoder's gradient for the encoder's K/V of that layer exists, so a
// shared weight's two contributions meet, and die, one layer at a time instead of after the whole
// decoder backward. Every rank must issue its collectives in one order, and the ranks' programs may
// differ in other ops, so the collectives run in a chain whose order depends only on which
// collective feeds which (dgemma-compile checks the plans agree). Other ops with effects keep their
// order in one chain, outputs in another, and the readers and writers of each assigned parameter in
// one chain each. Collectives are never deferred.
class RegionScheduler {
 public:
  // Schedules `ops` (a run of the block in order) and puts them, in their new order, before `end`.
  RegionScheduler(ArrayRef<Operation*> ops, Operation* end, const llvm::StringSet<>& assigned, int64_t depthBand)
      : ops_(ops.begin(), ops.end()), end_(end), depthBand_(depthBand) {
    for (auto [i, op] : llvm::enumerate(ops_)) index_[op] = i;
    const size_t n = ops_.size();
    deferred_.assign(n, false);
    orderedDeps_.resize(n);
    depth_.assign(n, 0);
    users_.resize(n);
    pending_.assign(n, 0);
    emitted_.assign(n, false);
    atEnd_.assign(n, false);

    std::optional<unsigned> lastEffect, lastOutput;
    llvm::StringMap<unsigned> lastParameterTouch;
    std::vector<bool> communication(n, false);
    std::vector<int64_t> collectivesBelow(n, 0);  // the longest chain of collectives this op depends on
    SmallVector<unsigned> collectives;
    for (unsigned i = 0; i < n; ++i) {
      Operation* op = ops_[i];
      communication[i] = isa<CommunicationOpInterface>(op);
      SmallVector<unsigned> chained;
      auto chainAfter = [&](std::optional<unsigned>& last) {
        if (last) chained.push_back(*last);
        last = i;
      };
      auto assign = dyn_cast<AssignOp>(op);
      if (isa<OutputOp>(op)) chainAfter(lastOutput);
      else if (!(assign && parameterBehindViews(assign.getTarget())) && !communication[i] && !isMemoryEffectFree(op))
        chainAfter(lastEffect);
      for (Value operand : op->getOperands()) {
        ParamOp param = parameterBehindViews(operand);
        if (!param || !assigned.contains(param.getName())) continue;
        auto [it, first] = lastParameterTouch.try_emplace(param.getName(), i);
        if (!first && it->second != i) {
          chained.push_back(it->second);
          it->second = i;
        }
      }
      bool readsBackward = false;
      int64_t backwardOperandElements = 0;
      SmallVector<unsigned> deps(chained);
      int64_t below = 0;
      for (unsigned dep : chained) below = std::max(below, collectivesBelow[dep] + (communication[dep] ? 1 : 0));
      for (Value operand : op->getOperands()) {
        auto it = index_.find(operand.getDefiningOp());
        if (it == index_.end()) continue;
        const unsigned producer = it->second;
        readsBackward = true;
        backwardOperandElements += elements(operand);
        below = std::max(below, collectivesBelow[producer] + (communication[producer] ? 1 : 0));
        if (deferred_[producer]) deps.append(orderedDeps_[producer]);
        else deps.push_back(producer);
      }
      collectivesBelow[i] = below;
      if (communication[i]) collectives.push_back(i);
      llvm::sort(deps);
      deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
      int64_t resultElements = 0;
      for (Value result : op->getResults()) resultElements += elements(result);
      deferred_[i] = !communication[i] && chained.empty() &&
                     (!readsBackward || op->hasAttr(kRecomputedAttr) || selectsAtCompileTime(op) ||
                      resultElements > kExpansion * backwardOperandElements);
      atEnd_[i] = isParameterUpdate(op);
      orderedDeps_[i] = std::move(deps);
    }
    // The collectives run in one chain, ordered by the longest chain of collectives each depends on,
    // then as autodiff wrote them: both depend only on which collective feeds which, the same on
    // every rank even where the ranks' programs differ in other ops (a tensor-parallel rank's fills).
    llvm::stable_sort(collectives, [&](unsigned a, unsigned b) { return collectivesBelow[a] < collectivesBelow[b]; });
    for (size_t k = 1; k < collectives.size(); ++k) orderedDeps_[collectives[k]].push_back(collectives[k - 1]);

    // Depths over the ordered ops, in a topological order.
    SmallVector<unsigned> worklist;
    for (unsigned i = 0; i < n; ++i) {
      if (deferred_[i] || atEnd_[i]) continue;
      for (unsigned dep : orderedDeps_[i]) users_[dep].push_back(i);
      pending_[i] = orderedDeps_[i].size();
      if (pending_[i] == 0) worklist.push_back(i);
    }
    std::vector<unsigned> unmet(pending_);
    while (!worklist.empty()) {
      unsigned next = worklist.pop_back_val();
      for (unsigned user : users_[next]) {
        depth_[user] = std::max(depth_[user], depth_[next] + 1);
        if (--unmet[user] == 0) worklist.push_back(user);
      }
    }
  }

  void run() {
    std::priority_queue<Key, std::vector<Key>, std::greater<Key>> ready;
    for (unsigned i = 0; i < ops_.size(); ++i)
      if (!deferred_[i] && !atEnd_[i] && pending_[i] == 0) ready.push(key(i));
    while (!ready.empty()) {
      unsigned next = std::get<2>(ready.top());
      ready.pop();
      emit(next);
      for (unsigned user : users_[next])
        if (--pending_[user] == 0) ready.push(key(user));
    }
    // Then the parameter updates, and deferred ops that nothing in the backward reads, in their old
    // order.
    for (unsigned i = 0; i < ops_.size(); ++i) emit(i);
  }

 private:
  // Ready ops run least key first: those that free a value of their result's type (they read its
  // last use) before the others, then by depth in bands of `depth-band`, then in the old order. Within
  // a band autodiff's order stands, which finishes one branch of a layer's backward before the next:
  // by exact depth every branch advanced at once and more of their intermediates were alive (the
  // tiny plans grew; docs/performance.md, "Scheduling the backward").
  using Key = std::tuple<bool, int64_t, unsigned>;
  Key key(unsigned i) const { return {!freesItsSize(i), depth_[i] / depthBand_, i}; }

  // Whether op i reads the last use of a backward value with the type of one of its results: it
  // then ends a lifetime as large as the one it starts (a sum of two gradients, say).
  bool freesItsSize(unsigned i) const {
    Operation* op = ops_[i];
    for (Value operand : op->getOperands()) {
      if (!index_.count(operand.getDefiningOp()) || !llvm::is_contained(op->getResultTypes(), operand.getType())) continue;
      bool last = llvm::all_of(operand.getUsers(), [&](Operation* user) {
        auto it = index_.find(user);
        return user == op || (it != index_.end() && emitted_[it->second]);
      });
      if (last) return true;
    }
    return false;
  }

  // Appends op i after the deferred ops it reads that have not run yet.
  void emit(unsigned i) {
    if (emitted_[i]) return;
    emitted_[i] = true;
    for (Value operand : ops_[i]->getOperands()) {
      auto it = index_.find(operand.getDefiningOp());
      if (it != index_.end() && (deferred_[it->second] || atEnd_[it->second])) emit(it->second);
    }
    ops_[i]->moveBefore(end_);
  }

  std::vector<Operation*> ops_;
  llvm::DenseMap<Operation*, unsigned> index_;
  Operation* end_;
  int64_t depthBand_;
  std::vector<bool> deferred_;
  std::vector<SmallVector<unsigned>> orderedDeps_;  // ordered ops this op waits for, deferred ones seen through
  std::vector<int64_t> depth_;
  std::vector<SmallVector<unsigned>> users_;
  std::vector<unsigned> pending_;
  std::vector<bool> emitted_;
  std::vector<bool> atEnd_;
};

struct DgBackwardSchedulePass : mlir::dg::impl::DgBackwardScheduleBase<DgBackwardSchedulePass> {
  using DgBackwardScheduleBase::DgBackwardScheduleBase;

  void runOnOperation() override {
    if (depthBand < 1) {
      getOperation().emitError() << "dg-backward-schedule: depth-band must be at least 1, got " << static_cast<int64_t>(depthBand);
      return signalPassFailure();
    }
    func::FuncOp function = getOperation();
    if (!function->hasAttr(kEntryAttr) || function.getBody().empty()) return;
    Block& body = function.getBody().front();
    Operation* lossOutput = nullptr;
    for (OutputOp output : body.getOps<OutputOp>())
      if (output.getName() == lossName) lossOutput = output;
    if (!lossOutput) return;  // nothing differentiated here
    const llvm::StringSet<> assigned = assignedParameters(body);
    recastParametersPerUse(body, assigned);
    // The forward keeps its order: interleaving the encoder's and decoder's forward passes kept more
    // intermediates alive at once than it saved (docs/performance.md).
    SmallVector<Operation*> backward;
    for (Operation* op = lossOutput->getNextNode(); op != body.getTerminator(); op = op->getNextNode())
      backward.push_back(op);
    RegionScheduler(backward, body.getTerminator(), assigned, depthBand).run();
  }
};

}  // namespace
