// dg-recompute (docs/training.md, "Recomputation"): values of a layer's forward that the backward
// reads are computed a second time, right before their first backward reader, from what the
// policy keeps; the forward's own copies then die with their last forward reader.
#include "compiler/Transforms/Passes.h"
#include "compiler/Transforms/RecomputePolicy.h"
#include "dialects/dg/IR/DgRecompute.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/IRMapping.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGRECOMPUTE
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

// One layer's forward: the ops from its dg.layer_begin op to its dg.layer_end op, in block order.
struct LayerSpan {
  int64_t layer = 0;
  Operation* begin = nullptr;
  Operation* end = nullptr;
};

// The spans of `body` in block order; a located error for an end that closes no open layer. A begin
// that no end follows before the next begin is a layer whose output nothing reads (the encoder's
// last layer, of which only the K/V are used): canonicalization erased its end, and it is kept whole.
FailureOr<SmallVector<LayerSpan>> layerSpans(Block& body) {
  SmallVector<LayerSpan> spans;
  std::optional<LayerSpan> open;
  for (Operation& op : body) {
    auto begin = op.getAttrOfType<IntegerAttr>(kLayerBeginAttr);
    auto end = op.getAttrOfType<IntegerAttr>(kLayerEndAttr);
    if (begin) open = LayerSpan{begin.getInt(), &op, nullptr};
    if (end) {
      if (!open || end.getInt() != open->layer) {
        op.emitOpError() << "ends layer " << end.getInt() << ", but "
                         << (open ? "layer " + std::to_string(open->layer) + " is open" : std::string("no layer is open"))
                         << " (each '" << kLayerEndAttr << "' follows the '" << kLayerBeginAttr << "' of its layer)";
        return failure();
      }
      open->end = &op;
      spans.push_back(*open);
      open.reset();
    }
  }
  return spans;
}

// Whether a recomputed region clones `op`. What is stored elsewhere (parameters, constants, inputs)
// it reads instead, and ops without a value (outputs, assignments) it leaves alone.
bool isClonable(Operation* op) {
  return op->getNumResults() > 0 && op->getNumRegions() == 0 && !isa<ParamOp, InputOp, ConstantOp, AssignOp>(op);
}

// The attention core and the MoE intermediates: the rows the expert dispatch exchanges and the
// experts' outputs (docs/training.md, "Recomputation").
bool isSelectiveOp(Operation* op) {
  return isa<AttentionOp, MoeExpertsOp, MoeDispatchOp, MoePermuteOp, AllToAllOp, MoeLocalExpertsOp, MoeCombineOp>(op);
}

class FunctionRecomputer {
 public:
  FunctionRecomputer(func::FuncOp function, Operation* loss) : body_(function.getBody().front()), loss_(loss) {}

  // Recomputes the ops of one region of the forward: `candidates` (in block order), whose values
  // the backward reads through clones; the rest of the region is kept.
  void recompute(ArrayRef<Operation*> candidates) {
    llvm::DenseSet<Operation*> candidateSet(candidates.begin(), candidates.end());
    // Backward readers of each candidate's results, and the first of them.
    SmallVector<OpOperand*> redirected;
    Operation* first = nullptr;
    for (Operation* op : candidates)
      for (Value result : op->getResults())
        for (OpOperand& use : result.getUses())
          if (isBackwardReader(use.getOwner())) {
            redirected.push_back(&use);
            if (!first || use.getOwner()->isBeforeInBlock(first)) first = use.getOwner();
          }
    if (redirected.empty()) return;

    // The candidates those readers need, directly or through other candidates.
    llvm::DenseSet<Operation*> needed;
    SmallVector<Operation*> worklist;
    for (OpOperand* use : redirected) worklist.push_back(use->get().getDefiningOp());
    while (!worklist.empty()) {
      Operation* op = worklist.pop_back_val();
      if (!needed.insert(op).second) continue;
      for (Value operand : op->getOperands())
        if (Operation* producer = operand.getDefiningOp(); producer && candidateSet.contains(producer))
          worklist.push_back(producer);
    }

    // Clones in forward order, before the first reader; random ops replay their (key, stream).
    OpBuilder builder(first);
    IRMapping mapping;
    for (Operation* op : candidates) {
      if (!needed.contains(op)) continue;
      Operation* clone = builder.clone(*op, mapping);
      clone->removeAttr(kLayerBeginAttr);
      clone->removeAttr(kLayerEndAttr);
      clone->setAttr(kRecomputedAttr, builder.getUnitAttr());
    }
    for (OpOperand* use : redirected) use->set(mapping.lookup(use->get()));
  }

 private:
  // A reader after the loss, other than an earlier clone or a boundary op (outputs and assignments
  // keep what they hand out: it lives to the end of the step either way).
  bool isBackwardReader(Operation* user) const {
    return user->getBlock() == &body_ && loss_->isBeforeInBlock(user) && !user->hasAttr(kRecomputedAttr) &&
           !isa<OutputOp, AssignOp>(user);
  }

  Block& body_;
  Operation* loss_;
};

struct DgRecomputePass : mlir::dg::impl::DgRecomputeBase<DgRecomputePass> {
  using DgRecomputeBase::DgRecomputeBase;

  void runOnOperation() override {
    const std::string policyText = policy;
    std::optional<RecomputePolicy> parsed = parseRecomputePolicy(policyText);
    if (!parsed) {
      getOperation().emitError() << "dg-recompute: policy '" << policyText << "': expected " << kRecomputePolicyExpected;
      return signalPassFailure();
    }
    policy_ = *parsed;
    func::FuncOp function = getOperation();
    if (!function->hasAttr(kEntryAttr) || function.getBody().empty()) return;
    Block& body = function.getBody().front();
    FailureOr<SmallVector<LayerSpan>> spans = layerSpans(body);
    if (failed(spans)) return signalPassFailure();
    Operation* loss = nullptr;
    for (auto output : body.getOps<OutputOp>())
      if (output.getName() == StringRef(lossName)) loss = output.getOperation();
    // Without a loss there is no backward, so nothing is read twice.
    if (!loss || policy_.kind == RecomputePolicy::Kind::None) return;
    FunctionRecomputer recomputer(function, loss);
    for (ArrayRef<Operation*> region : regions(*spans)) recomputer.recompute(region);
  }

 private:
  // The policy's regions, each as its candidate ops in block order: under full, chunks of
  // layersPerChunk consecutive layers of one stack (layer indices kN .. kN+N-1), everything but
  // the chunk's output (the next chunk's input, kept); under selective, each layer's attention
  // core and MoE intermediates.
  std::vector<SmallVector<Operation*>> regions(ArrayRef<LayerSpan> spans) const {
    std::vector<SmallVector<Operation*>> result;
    auto collect = [](Operation* from, Operation* to, auto keep) {
      SmallVector<Operation*> ops;
      for (Operation* op = from;; op = op->getNextNode()) {
        if (keep(op)) ops.push_back(op);
        if (op == to) break;
      }
      return ops;
    };
    if (policy_.kind == RecomputePolicy::Kind::Selective) {
      for (const LayerSpan& span : spans) {
        // A reshape is a view that would keep its input alive: the views of recomputed values go with them.
        llvm::SmallPtrSet<Operation*, 16> chosen;
        result.push_back(collect(span.begin, span.end, [&](Operation* op) {
          Operation* viewed = isa<ReshapeOp>(op) ? op->getOperand(0).getDefiningOp() : nullptr;
          if (isSelectiveOp(op) || (viewed && chosen.contains(viewed))) chosen.insert(op);
          return chosen.contains(op);
        }));
      }
      return result;
    }
    for (size_t first = 0; first < spans.size();) {
      size_t last = first;
      // A chunk ends at a multiple of N or where the next span is not the next layer of this stack.
      while (last + 1 < spans.size() && spans[last + 1].layer == spans[last].layer + 1 &&
             spans[last + 1].layer % policy_.layersPerChunk != 0)
        ++last;
      Operation* output = spans[last].end;
      result.push_back(collect(spans[first].begin, output,
                               [&](Operation* op) { return op != output && isClonable(op); }));
      first = last + 1;
    }
    return result;
  }

  RecomputePolicy policy_;
};

}  // namespace
