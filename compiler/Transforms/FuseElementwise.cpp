// dg-fuse-elementwise: contiguous chains of elementwise ops whose intermediate values have no other reader
// become one dg.fused_elementwise, one plan step whose kernel evaluates the chain per element
// without intermediate tensors (docs/kernels.md, "Fused elementwise chains").
#include <set>

#include "llvm/ADT/TypeSwitch.h"

#include "compiler/Transforms/Passes.h"
#include "dialects/dg/IR/DgRecompute.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "plan/FusedElementwiseProgram.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGFUSEELEMENTWISE
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

// The program opcode of an op the fused kernel can evaluate, or nullopt.
std::optional<dgemma::fused::Opcode> opcodeOf(Operation* op) {
  using dgemma::fused::Opcode;
  if (op->getNumResults() != 1 || fusedElementwiseDTypeName(getElementTypeOrSelf(op->getResult(0))).empty() ||
      getElementTypeOrSelf(op->getResult(0)).isInteger(1))
    return std::nullopt;
  if (auto cast = dyn_cast<CastOp>(op)) {
    if (!isa<FloatType>(getElementTypeOrSelf(cast.getInput()))) return std::nullopt;
    return Opcode::Cast;
  }
  if (auto select = dyn_cast<SelectOp>(op)) {
    // Written in place into a parameter, it has no storage of its own to fuse into.
    if (inPlaceAssignTarget(select.getResult())) return std::nullopt;
    return Opcode::Select;
  }
  return llvm::TypeSwitch<Operation*, std::optional<Opcode>>(op)
      .Case([](AddOp) { return Opcode::Add; })
      .Case([](SubOp) { return Opcode::Sub; })
      .Case([](MulOp) { return Opcode::Mul; })
      .Case([](DivOp) { return Opcode::Div; })
      .Case([](MaximumOp) { return Opcode::Maximum; })
      .Case([](MinimumOp) { return Opcode::Minimum; })
      .Case([](NegOp) { return Opcode::Neg; })
      .Case([](ExpOp) { return Opcode::Exp; })
      .Case([](LogOp) { return Opcode::Log; })
      .Case([](TanhOp) { return Opcode::Tanh; })
      .Case([](SqrtOp) { return Opcode::Sqrt; })
      .Case([](RsqrtOp) { return Opcode::Rsqrt; })
      .Case([](GeluTanhOp) { return Opcode::GeluTanh; })
      .Default([](Operation*) { return std::nullopt; });
}

// Whether the op computes in f64; a fused kernel computes in f64 or in f32 (f32, bf16, f16), and a
// cast between the two is never fused.
std::optional<bool> computesInF64(Operation* op) {
  bool f64 = false, narrower = false;
  auto note = [&](Type type) {
    Type element = getElementTypeOrSelf(type);
    if (element.isF64()) f64 = true;
    else if (isa<FloatType>(element)) narrower = true;
  };
  llvm::for_each(op->getOperandTypes(), note);
  llvm::for_each(op->getResultTypes(), note);
  if (f64 && narrower) return std::nullopt;
  return f64;
}

class FuseElementwise {
 public:
  explicit FuseElementwise(Block& block) {
    for (Operation& op : block) ops_.push_back(&op);
    for (auto [index, op] : llvm::enumerate(ops_)) position_[op] = static_cast<int64_t>(index);
  }

  void run() {
    // From the last op back: a root's group takes in its producers, so each op is decided as a root
    // only after every op that could have absorbed it.
    for (size_t index = ops_.size(); index-- > 0;) {
      Operation* root = ops_[index];
      if (erased_.contains(root) || !opcodeOf(root) || !computesInF64(root)) continue;
      SmallVector<Operation*> group = groupOf(root);
      if (group.size() >= 2) fuse(root, group);
    }
  }

 private:
  // The root and the producers that join it, in block order.
  SmallVector<Operation*> groupOf(Operation* root) {
    const auto shape = cast<RankedTensorType>(root->getResult(0).getType()).getShape();
    const bool f64 = *computesInF64(root);
    const bool recomputed = root->hasAttr(kRecomputedAttr);
    llvm::SmallPtrSet<Operation*, 16> members{root};
    // Candidates latest first: every user a candidate may have in the group comes after it, so it
    // has been decided by the time the candidate is.
    auto later = [&](Operation* a, Operation* b) { return position_.lookup(a) > position_.lookup(b); };
    std::set<Operation*, decltype(later)> candidates(later);
    auto addProducers = [&](Operation* op) {
      for (Value operand : op->getOperands())
        if (Operation* producer = operand.getDefiningOp(); producer && position_.contains(producer))
          candidates.insert(producer);
    };
    addProducers(root);
    while (!candidates.empty()) {
      Operation* candidate = *candidates.begin();
      candidates.erase(candidates.begin());
      if (members.contains(candidate) || !opcodeOf(candidate)) continue;
      if (computesInF64(candidate) != std::optional<bool>(f64)) continue;
      if (candidate->hasAttr(kRecomputedAttr) != recomputed) continue;
      if (cast<RankedTensorType>(candidate->getResult(0).getType()).getShape() != shape) continue;
      if (!llvm::all_of(candidate->getUsers(), [&](Operation* user) { return members.contains(user); })) continue;
      // The group is a contiguous run of ops ending at the root, so the fused op keeps no input
      // alive longer than the chain did (a member far before the root would hold its operands until
      // the root: measured, that grows the activations arena), and nothing moves past a collective
      // or an assignment, which are never members.
      if (!contiguousWith(candidate, root, members)) continue;
      members.insert(candidate);
      addProducers(candidate);
    }
    SmallVector<Operation*> group(members.begin(), members.end());
    llvm::sort(group, [&](Operation* a, Operation* b) { return position_.lookup(a) < position_.lookup(b); });
    return group;
  }

  // Whether every op between `candidate` and the root is a member already.
  bool contiguousWith(Operation* candidate, Operation* root, const llvm::SmallPtrSetImpl<Operation*>& members) {
    const int64_t from = position_.lookup(candidate) + 1, to = position_.lookup(root);
    return llvm::all_of(llvm::ArrayRef(ops_).slice(from, to - from),
                        [&](Operation* between) { return members.contains(between); });
  }

  void fuse(Operation* root, ArrayRef<Operation*> group) {
    llvm::SmallPtrSet<Operation*, 16> members(group.begin(), group.end());
    SmallVector<Value> inputs;
    llvm::DenseMap<Value, int64_t> number;
    for (Operation* op : group)
      for (Value operand : op->getOperands()) {
        Operation* producer = operand.getDefiningOp();
        if ((producer && members.contains(producer)) || number.contains(operand)) continue;
        number[operand] = static_cast<int64_t>(inputs.size());
        inputs.push_back(operand);
      }
    dgemma::fused::Program program;
    SmallVector<Location> locations{root->getLoc()};
    for (Operation* op : group) {
      dgemma::fused::Instruction instruction;
      instruction.opcode = *opcodeOf(op);
      instruction.dtype = fusedElementwiseDTypeName(getElementTypeOrSelf(op->getResult(0))).str();
      for (Value operand : op->getOperands()) instruction.args.push_back(number.lookup(operand));
      number[op->getResult(0)] = static_cast<int64_t>(inputs.size() + program.instructions.size());
      program.instructions.push_back(std::move(instruction));
      if (op != root) locations.push_back(op->getLoc());
    }
    OpBuilder builder(root);
    auto fused = builder.create<FusedElementwiseOp>(FusedLoc::get(root->getContext(), locations),
                                                    root->getResult(0).getType(), inputs,
                                                    builder.getStringAttr(dgemma::fused::printProgram(program)));
    // The root's marks (dg.recomputed, the sharding annotations) describe the fused value too.
    for (NamedAttribute attribute : root->getDiscardableAttrs()) fused->setAttr(attribute.getName(), attribute.getValue());
    root->getResult(0).replaceAllUsesWith(fused.getResult());
    for (Operation* op : llvm::reverse(group)) {
      erased_.insert(op);
      op->erase();
    }
  }

  std::vector<Operation*> ops_;  // the block's ops before fusion, in order
  llvm::DenseMap<Operation*, int64_t> position_;
  llvm::DenseSet<Operation*> erased_;
};

struct DgFuseElementwisePass : public mlir::dg::impl::DgFuseElementwiseBase<DgFuseElementwisePass> {
  void runOnOperation() override {
    for (Block& block : getOperation().getBody()) FuseElementwise(block).run();
  }
};

}  // namespace
