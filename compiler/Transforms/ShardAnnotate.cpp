// dg-shard-annotate: the module's mesh and the shardings of the graph's sources for one parallel
// layout (docs/parallelism.md, "Annotation and propagation"). Parameters follow the role the model
// gave them (dg.role; "Tensor-parallel mapping"); gradient buffers and Adam moments follow their
// parameter, the buffers as pending sums over the ranks whose contributions they collect, the moments
// additionally split over the data group under ZeRO-1; batch inputs split their batch dimension over
// the data group. Everything else is left to dg-shard-propagate.
#include "compiler/Transforms/Passes.h"
#include "compiler/Transforms/ShardingConsistency.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringMap.h"
#include "plan/Names.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGSHARDANNOTATE
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

using Axes = SmallVector<StringRef>;

// What a parameter name denotes: a model parameter, the gradient buffer of one, or one of its
// optimizer states.
enum class ParameterKind { Model, Gradient, OptimizerState };
struct ParameterName {
  ParameterKind kind;
  StringRef model;  // the model parameter's name
};
ParameterName parseParameterName(StringRef name) {
  if (name.consume_front(dgemma::kGradientPrefix)) return {ParameterKind::Gradient, name};
  if (name.consume_front(dgemma::kOptimizerStatePrefix)) return {ParameterKind::OptimizerState, name.split('/').second};
  return {ParameterKind::Model, name};
}

struct ModelParameter {
  StringRef role = kRoleReplicated;
  bool trainable = false;
  int64_t sharedHeads = 0;  // dg.heads: the attention heads of a K/V projection's rows
};

class Annotator {
 public:
  Annotator(ModuleOp module, const LayoutGroups& groups, bool zero1) : module_(module), groups_(groups), zero1_(zero1) {
    module->setAttr(kMeshAttr, meshAttr(module.getContext(), groups.axes));
    mesh_ = Mesh::of(module);
  }

  LogicalResult run() {
    module_.walk([&](ParamOp param) {
      if (parseParameterName(param.getName()).kind != ParameterKind::Model) return;
      ModelParameter& model = models_[param.getName()];
      if (auto role = param->getAttrOfType<StringAttr>(kRoleAttr)) model.role = role.getValue();
      if (auto heads = param->getAttrOfType<IntegerAttr>(kHeadsAttr)) model.sharedHeads = heads.getInt();
      // A frozen base (dg-lora) is a model weight like the trainable ones: it splits by its role.
      model.trainable = param.getTrainable() || param->hasAttr(kFrozenBaseAttr);
    });
    WalkResult result = module_.walk([&](Operation* op) {
      if (auto param = dyn_cast<ParamOp>(op)) return failed(annotate(param)) ? WalkResult::interrupt() : WalkResult::advance();
      if (auto input = dyn_cast<InputOp>(op)) return failed(annotate(input)) ? WalkResult::interrupt() : WalkResult::advance();
      return WalkResult::advance();
    });
    return failure(result.wasInterrupted());
  }

 private:
  static Axes names(ArrayRef<std::string> axes) { return Axes(axes.begin(), axes.end()); }

  // The outer tensor axes whose blocks hold whole heads of `heads`: all of them when TP divides
  // the heads, else those up to the cut at `heads` (layoutGroups); each head is replicated over
  // the rest, whose ranks hold query heads of the same group.
  Axes wholeHeadAxes(int64_t heads) const {
    Axes axes;
    int64_t product = 1;
    for (const std::string& axis : groups_.tensor) {
      const int64_t size = *mesh_.axisSize(axis);
      if (heads % (product * size) != 0) break;
      product *= size;
      axes.push_back(axis);
    }
    return axes;
  }

  void set(Operation* op, ArrayRef<Axes> dims, ArrayRef<StringRef> partial) {
    ShardingAttr sharding = ShardingAttr::get(op->getContext(), dims, inMeshOrder(mesh_, partial));
    op->setAttr(kShardingsAttr, ArrayAttr::get(op->getContext(), {sharding}));
  }

  LogicalResult annotate(ParamOp param) {
    ParameterName name = parseParameterName(param.getName());
    auto type = param.getType();
    SmallVector<Axes> dims(type.getRank());
    auto modelIt = models_.find(name.model);
    // Buffers (non-trainable model parameters other than a frozen base) and names without a model
    // parameter stay whole.
    if (modelIt == models_.end() || !modelIt->second.trainable) {
      set(param, dims, {});
      return success();
    }
    StringRef role = modelIt->second.role;
    bool experts = role == kRoleExperts;
    auto split = [&](int64_t dim, Axes axes) -> LogicalResult {
      if (axes.empty()) return success();
      if (dim >= type.getRank() || type.getDimSize(dim) % axesSize(mesh_, axes) != 0)
        return param.emitOpError() << "parameter '" << param.getName() << "' (role \"" << role << "\") cannot split dim "
                                   << dim << " over " << axesSize(mesh_, axes) << " ranks: its shape is " << type;
      dims[dim] = axes;
      return success();
    };
    LogicalResult roleSplit = success();
    if (role == kRoleColumn && modelIt->second.sharedHeads > 0)
      roleSplit = split(0, wholeHeadAxes(modelIt->second.sharedHeads));
    else if (role == kRoleVocab || role == kRoleColumn) roleSplit = split(0, names(groups_.tensor));
    else if (role == kRoleRow) roleSplit = split(1, names(groups_.tensor));
    else if (experts) roleSplit = split(0, names(groups_.expert));
    if (failed(roleSplit)) return failure();

    Axes dataGroup = names(experts ? groups_.expertData : groups_.data);
    Axes partial;
    if (name.kind == ParameterKind::Gradient) {
      // Every rank of the data group adds its own tokens' contribution. The context ranks hold other
      // tokens of the same sequences, so they add theirs too. Over the tensor axes the parameter is
      // not split over, the ranks see different heads or tokens: a whole parameter's gradient is in
      // general a sum over the tensor group, a replicated KV head's over the ranks that hold it (the
      // query heads of its group).
      partial = dataGroup;
      llvm::append_range(partial, names(groups_.context));
      for (StringRef axis : names(groups_.tensor))
        if (!llvm::is_contained(partial, axis) &&
            llvm::none_of(dims, [&](const Axes& d) { return llvm::is_contained(d, axis); }))
          partial.push_back(axis);
    }
    // ZeRO-1 over the data group and, as in Megatron, the context ranks, whose gradients are summed
    // with it; optimizer_step splits no sequence, so the context axis cuts contiguous blocks there
    // (Reshard.h). Where the data group is one rank (the 26B's experts at EDP 1), the state stays
    // whole: the sum over the context ranks is then an all-reduce in the gradient buffer's own
    // bytes, where a shard would be a reduce-scatter whose result waits for the clip in a
    // communication buffer (docs/parallelism.md, "Gradient reduction").
    Axes shardGroup = dataGroup;
    if (!dataGroup.empty()) llvm::append_range(shardGroup, names(groups_.context));
    if (name.kind == ParameterKind::OptimizerState && zero1_ && !shardGroup.empty()) {
      // The first dimension whose local block the group divides.
      int64_t groupSize = axesSize(mesh_, shardGroup);
      for (int64_t d = 0; d < type.getRank(); ++d) {
        int64_t local = type.getDimSize(d) / axesSize(mesh_, dims[d]);
        if (local % groupSize != 0) continue;
        llvm::append_range(dims[d], shardGroup);
        break;
      }
    }
    set(param, dims, partial);
    return success();
  }

  // A batch field's leading dimension of the bucket's micro-batch size splits over the data group.
  LogicalResult annotate(InputOp input) {
    auto type = cast<RankedTensorType>(input.getType());
    SmallVector<Axes> dims(type.getRank());
    auto function = input->getParentOfType<func::FuncOp>();
    auto bucket = function ? function->getAttrOfType<DictionaryAttr>(kBucketAttr) : DictionaryAttr();
    auto micro = bucket ? bucket.getAs<IntegerAttr>("micro_batch") : IntegerAttr();
    Axes data = names(groups_.data);
    if (micro && type.getRank() > 0 && type.getDimSize(0) == micro.getInt() && !data.empty()) {
      if (micro.getInt() % axesSize(mesh_, data) != 0)
        return input.emitOpError() << "input '" << input.getName() << "': the bucket's micro_batch "
                                   << micro.getInt() << " is not divisible by the data-parallel size "
                                   << axesSize(mesh_, data);
      dims[0] = data;
    }
    set(input, dims, {});
    return success();
  }

  ModuleOp module_;
  const LayoutGroups& groups_;
  bool zero1_;
  Mesh mesh_;
  llvm::StringMap<ModelParameter> models_;
};

struct DgShardAnnotatePass : mlir::dg::impl::DgShardAnnotateBase<DgShardAnnotatePass> {
  using DgShardAnnotateBase::DgShardAnnotateBase;
  void runOnOperation() override {
    // A weight of shared heads (dg.heads) splits min(heads, tp) ways; the mesh needs a cut there.
    SmallVector<int64_t> sharedHeadSplits;
    getOperation().walk([&](ParamOp param) {
      if (auto heads = param->getAttrOfType<IntegerAttr>(kHeadsAttr)) sharedHeadSplits.push_back(heads.getInt());
    });
    std::optional<LayoutGroups> groups =
        layoutGroups(tensorParallel, dataParallel, expertParallel, contextParallel, sharedHeadSplits);
    if (!groups) {
      InFlightDiagnostic error = getOperation().emitError()
                                 << "dg-shard-annotate: the layout tp=" << tensorParallel.getValue()
                                 << " dp=" << dataParallel.getValue() << " ep=" << expertParallel.getValue();
      if (contextParallel != 1) error << " cp=" << contextParallel.getValue();
      error << " has no mesh (sizes must be >= 1, ep must divide dp, tp must divide ep when ep > 1, "
               "and every shared-head count below tp must divide tp and the larger ones below it)";
      return signalPassFailure();
    }
    if (sequenceParallel && tensorParallel == 1) {
      getOperation().emitError() << "dg-shard-annotate: sp needs tp > 1 (the sequence splits over the tensor group)";
      return signalPassFailure();
    }
    if (failed(Annotator(getOperation(), *groups, zero1).run())) signalPassFailure();
  }
};

}  // namespace
