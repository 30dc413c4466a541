// dg-shard-partition: one rank's program from a module whose ops carry result and operand shardings
// (docs/parallelism.md, "Partitioning"). Ops are rewritten in place, in program order, so every
// operand is already local when its user is reached: the user's operands are resharded from their
// producers' layouts to the ones it consumes, then its results take their local types. Ops whose
// meaning depends on global positions (constants, lookups into a split table, a split expert set,
// the entry point's boundary) get this rank's offsets, known at compile time.
#include <algorithm>

#include "compiler/Transforms/Passes.h"
#include "compiler/Transforms/Reshard.h"
#include "dialects/dg/IR/DgMesh.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "llvm/ADT/DenseMap.h"

namespace mlir::dg {
#define GEN_PASS_DEF_DGSHARDPARTITION
#include "compiler/Transforms/Passes.h.inc"
}  // namespace mlir::dg

using namespace mlir;
using namespace mlir::dg;

namespace {

ShardingAttr shardingAt(Operation* op, StringRef attrName, unsigned index) {
  auto shardings = op->getAttrOfType<ArrayAttr>(attrName);
  return shardings ? dyn_cast<ShardingAttr>(shardings[index]) : ShardingAttr();
}

// Whether the rank's part of a value that is a pending sum over `sharding`'s partial axes is zero:
// only the ranks with coordinate 0 on every such axis hold the value itself.
bool holdsZerosOfPendingSum(const Mesh& mesh, int64_t rank, ShardingAttr sharding) {
  for (StringRef axis : sharding.getPartialAxes())
    if (*mesh.coordinate(rank, axis) != 0) return true;
  return false;
}

// The block of `dense` that starts at `offset` and has `localType`'s shape.
DenseElementsAttr sliceConstant(DenseElementsAttr dense, ArrayRef<int64_t> offset, RankedTensorType localType) {
  if (dense.isSplat()) return DenseElementsAttr::get(localType, dense.getSplatValue<Attribute>());
  ArrayRef<int64_t> globalShape = dense.getType().getShape();
  ArrayRef<int64_t> localShape = localType.getShape();
  SmallVector<Attribute> all(dense.getValues<Attribute>());
  SmallVector<Attribute> block;
  block.reserve(localType.getNumElements());
  SmallVector<int64_t> index(localShape.size(), 0);
  for (int64_t element = 0; element < localType.getNumElements(); ++element) {
    int64_t flat = 0;
    for (size_t dim = 0; dim < localShape.size(); ++dim) flat = flat * globalShape[dim] + offset[dim] + index[dim];
    block.push_back(all[flat]);
    for (int64_t dim = static_cast<int64_t>(localShape.size()) - 1; dim >= 0; --dim) {
      if (++index[dim] < localShape[dim]) break;
      index[dim] = 0;
    }
  }
  return DenseElementsAttr::get(localType, block);
}

class Partitioner {
 public:
  Partitioner(ModuleOp module, int64_t rank) : module_(module), mesh_(Mesh::of(module)), rank_(rank) {}

  LogicalResult run() {
    if (rank_ < 0 || rank_ >= mesh_.worldSize())
      return module_.emitError() << "dg-shard-partition: rank " << rank_ << " is outside the mesh's "
                                 << mesh_.worldSize() << " ranks";
    for (auto function : module_.getOps<func::FuncOp>()) {
      if (function.isExternal()) continue;
      if (function.getNumArguments() != 0)
        return function.emitOpError() << "has arguments; dg-shard-partition expects values from dg.param and dg.input";
      resharded_.clear();
      // Only an entry whose sequences the model splits over the context axis (dg.context_split)
      // holds sequence chunks; elsewhere a context split is the optimizer state's ZeRO-1 shard.
      contextSplitsSequences_ = false;
      function.walk([&](Operation* op) { contextSplitsSequences_ |= op->hasAttr(kContextSplitAttr); });
      SmallVector<Operation*> ops;
      function.walk([&](Operation* op) {
        if (op != function.getOperation()) ops.push_back(op);
      });
      for (Operation* op : ops)
        if (failed(partition(op))) return failure();
      // Erased only now: the list above still names them.
      for (Operation* op : replaced_) op->erase();
      replaced_.clear();
    }
    module_.walk([](Operation* op) {
      op->removeAttr(kShardingsAttr);
      op->removeAttr(kOperandShardingsAttr);
    });
    return success();
  }

 private:
  LogicalResult partition(Operation* op) {
    if (isa<func::ReturnOp>(op)) return success();
    if (failed(localizeOperands(op))) return failure();
    for (OpResult result : op->getResults()) {
      ShardingAttr sharding = shardingAt(op, kShardingsAttr, result.getResultNumber());
      if (!sharding)
        return op->emitOpError() << "has no dg.shardings entry for result " << result.getResultNumber()
                                 << ": run dg-shard-propagate before dg-shard-partition";
      auto globalType = cast<RankedTensorType>(result.getType());
      producedSharding_[result] = sharding;
      result.setType(RankedTensorType::get(mesh_.localShape(sharding, globalType.getShape()),
                                           globalType.getElementType()));
      if (isa<ParamOp, InputOp>(op)) {
        if (isa<InputOp>(op) && !sharding.getPartialAxes().empty())
          return op->emitOpError() << "is a pending sum in its sharding " << sharding
                                   << "; an input is fed whole or as a box";
        recordBox(op, sharding, globalType.getShape());
        if (isa<ParamOp>(op) && failed(recordPendingSum(op, sharding))) return failure();
      }
      if (auto constant = dyn_cast<ConstantOp>(op)) {
        if (failed(localizeConstant(constant, sharding, globalType))) return failure();
      }
    }
    return localizeAttributes(op);
  }

  // Reshards every operand from its producer's layout to the one `op` consumes it in.
  LogicalResult localizeOperands(Operation* op) {
    OpBuilder builder(op);
    for (OpOperand& operand : op->getOpOperands()) {
      unsigned index = operand.getOperandNumber();
      Value value = operand.get();
      auto produced = producedSharding_.find(value);
      if (produced == producedSharding_.end())
        return op->emitOpError() << "operand " << index << " has no producer sharding";
      // An assign writes the parameter's own storage: the target stays as it is and the value
      // takes the parameter's layout.
      if (auto assign = dyn_cast<AssignOp>(op)) {
        if (value == assign.getTarget()) continue;
        auto target = producedSharding_.find(assign.getTarget());
        if (failed(reshardOperand(builder, operand, produced->second, target->second))) return failure();
        continue;
      }
      ShardingAttr consumed = shardingAt(op, kOperandShardingsAttr, index);
      if (!consumed)
        return op->emitOpError() << "has no dg.operand_shardings entry for operand " << index
                                 << ": run dg-shard-propagate before dg-shard-partition";
      if (isa<OutputOp>(op) && !consumed.getPartialAxes().empty())
        return op->emitOpError() << "hands out a pending sum (" << consumed
                                 << "); outputs must be all-reduced first";
      if (failed(reshardOperand(builder, operand, produced->second, consumed))) return failure();
    }
    if (auto output = dyn_cast<OutputOp>(op)) {
      ShardingAttr consumed = shardingAt(op, kOperandShardingsAttr, 0);
      auto localType = cast<RankedTensorType>(output.getValue().getType());
      SmallVector<int64_t> globalShape(localType.getShape());
      for (int64_t dim = 0; dim < localType.getRank(); ++dim) globalShape[dim] *= mesh_.splitOf(consumed, dim);
      recordBox(op, consumed, globalShape);
    }
    return success();
  }

  LogicalResult reshardOperand(OpBuilder& builder, OpOperand& operand, ShardingAttr from, ShardingAttr to) {
    Value value = operand.get();
    auto key = std::make_pair(value, Attribute(to));
    auto reused = resharded_.find(key);
    if (reused != resharded_.end()) {
      operand.set(reused->second);
      return success();
    }
    FailureOr<Value> local =
        buildReshard(builder, operand.getOwner(), mesh_, rank_, value, from, to, contextSplitsSequences_);
    if (failed(local)) return failure();
    resharded_[key] = *local;
    operand.set(*local);
    return success();
  }

  // A parameter stored as a pending sum is the sum of every rank's box only when each mesh axis
  // either splits it or is one of the sum's axes; the runtime relies on that to assemble it.
  LogicalResult recordPendingSum(Operation* op, ShardingAttr sharding) {
    if (sharding.getPartialAxes().empty()) return success();
    SmallVector<StringRef> used = sharding.getUsedAxes();
    for (const Mesh::Axis& axis : mesh_.axes())
      if (axis.size > 1 && !llvm::is_contained(used, axis.name))
        return op->emitOpError() << "is stored as a pending sum " << sharding << " but replicated over mesh axis '"
                                 << axis.name << "'; a stored pending sum must be split or summed over every axis";
    op->setAttr(kPendingSumAttr, UnitAttr::get(op->getContext()));
    return success();
  }

  void recordBox(Operation* op, ShardingAttr sharding, ArrayRef<int64_t> globalShape) {
    Builder builder(op->getContext());
    op->setAttr(kGlobalShapeAttr, builder.getDenseI64ArrayAttr(globalShape));
    op->setAttr(kShardOffsetAttr, builder.getDenseI64ArrayAttr(mesh_.shardOffset(sharding, globalShape, rank_)));
  }

  LogicalResult localizeConstant(ConstantOp constant, ShardingAttr sharding, RankedTensorType globalType) {
    auto dense = dyn_cast<DenseElementsAttr>(constant.getValue());
    if (!dense) return constant.emitOpError() << "is not a dense constant, so dg-shard-partition cannot cut it";
    auto localType = cast<RankedTensorType>(constant.getResult().getType());
    DenseElementsAttr local =
        holdsZerosOfPendingSum(mesh_, rank_, sharding)
            ? DenseElementsAttr::get(localType, Builder(constant).getZeroAttr(localType.getElementType()))
            : sliceConstant(dense, mesh_.shardOffset(sharding, globalType.getShape(), rank_), localType);
    constant.setValueAttr(local);
    return success();
  }

  // Attributes that name global positions or sizes, made this rank's.
  LogicalResult localizeAttributes(Operation* op) {
    Builder builder(op->getContext());
    auto firstRow = [&](ShardingAttr table, Value localTable) {
      auto localType = cast<RankedTensorType>(localTable.getType());
      int64_t blocks = mesh_.splitOf(table, 0);
      SmallVector<int64_t> globalShape(localType.getShape());
      globalShape[0] *= blocks;
      return mesh_.shardOffset(table, globalShape, rank_)[0];
    };
    if (auto fill = dyn_cast<FillOp>(op)) {
      if (holdsZerosOfPendingSum(mesh_, rank_, shardingAt(op, kShardingsAttr, 0)))
        fill.setValueAttr(builder.getF64FloatAttr(0.0));
      return success();
    }
    if (auto gather = dyn_cast<GatherOp>(op)) {
      ShardingAttr table = shardingAt(op, kOperandShardingsAttr, 0);
      if (mesh_.splitOf(table, 0) > 1) op->setAttr("row_offset", builder.getI64IntegerAttr(firstRow(table, gather.getTable())));
      return success();
    }
    if (auto scatter = dyn_cast<ScatterAddOp>(op)) {
      ShardingAttr table = shardingAt(op, kShardingsAttr, 0);
      if (mesh_.splitOf(table, 0) > 1)
        op->setAttr("row_offset", builder.getI64IntegerAttr(firstRow(table, scatter.getResult())));
      return success();
    }
    if (isa<MoeExpertsOp, MoeExpertsBackwardOp>(op)) {
      constexpr unsigned kGateUp = 3;
      ShardingAttr experts = shardingAt(op, kOperandShardingsAttr, kGateUp);
      if (mesh_.splitOf(experts, 0) > 1)
        op->setAttr("expert_offset", builder.getI64IntegerAttr(firstRow(experts, op->getOperand(kGateUp))));
      return success();
    }
    if (auto attention = dyn_cast<AttentionOp>(op))
      return localizeQueryBlock(op, attention.getMask(), /*backward=*/false);
    if (auto backward = dyn_cast<AttentionBackwardOp>(op))
      return localizeQueryBlock(op, backward.getMask(), /*backward=*/true);
    if (auto mean = dyn_cast<ReduceMeanOp>(op)) {
      scaleMeanOverSplitDims(mean);
      return success();
    }
    if (isa<ReduceMaxOp>(op)) return checkMaximumIsLocal(op);
    if (auto slice = dyn_cast<SliceOp>(op)) return checkWhole(op, 0, slice.getDim(), "slices");
    if (auto concat = dyn_cast<ConcatOp>(op)) {
      for (unsigned index = 0; index < op->getNumOperands(); ++index)
        if (failed(checkWhole(op, index, concat.getDim(), "concatenates"))) return failure();
      return success();
    }
    return success();
  }

  // Attention whose queries are split on the sequence over a context axis of N ranks (docs/
  // parallelism.md, "Context parallelism"): the rank holds the query chunks c and 2N - 1 - c of 2N
  // (the load-balanced order, Reshard.h) over whole keys. The op places its Tq queries at the last Tq
  // key positions, so each chunk, starting at global query g * C, runs as its own op over the keys
  // [begin, end) with end = Tk - Tq_global + (g + 1) * C and begin 0, or under a sliding window W the
  // first key the chunk's first query sees, end - C - (W - 1): the keys, values and their per-key
  // operands are cut to that range, which keeps the causal mask, the window and the document ids
  // exact at global positions. Under the image overlay's segment ids the chunk keeps every key and
  // its trailing_keys attribute (Tk - end) places its queries at the same global positions. The
  // chunks' outputs (the backward's query gradients) are concatenated; the backward's key and value
  // gradients come out for each range, padded with zeros to Tk and added: the rank's share of their
  // pending sum over the context group.
  LogicalResult localizeQueryBlock(Operation* op, AttentionMask mask, bool backward) {
    constexpr unsigned kQuery = 0, kKey = 1, kValue = 2, kKeyValid = 3, kGradOutput = 4;
    ShardingAttr querySharding = shardingAt(op, kOperandShardingsAttr, kQuery);
    SmallVector<StringRef> queryAxes = querySharding.getDimAxes(1);
    if (queryAxes.empty()) return success();
    auto isContext = [&](StringRef name) {
      return llvm::any_of(mesh_.axes(),
                          [&](const Mesh::Axis& axis) { return axis.name == name && axis.role == AxisRole::Context; });
    };
    if (queryAxes.size() != 1 || !isContext(queryAxes.front()))
      return op->emitOpError() << "splits its queries over " << querySharding
                               << "; only a split over one context axis is partitioned (context parallelism)";
    if (mask != AttentionMask::Causal)
      return op->emitOpError()
             << "splits its queries over " << querySharding
             << " under a non-causal mask; only causal attention splits its queries (context parallelism)";
    // The image overlay lets a query see every key of its image, later ones and those outside the
    // window included, so a chunk under segment ids keeps all the keys and is placed among them by
    // trailing_keys.
    const bool segmented =
        backward ? bool(cast<AttentionBackwardOp>(op).getSegmentIds()) : bool(cast<AttentionOp>(op).getSegmentIds());
    const int64_t ranks = *mesh_.axisSize(queryAxes.front()), coordinate = *mesh_.coordinate(rank_, queryAxes.front());
    auto localQuery = cast<RankedTensorType>(op->getOperand(kQuery).getType());
    const int64_t chunk = localQuery.getDimSize(1) / 2, globalQueries = localQuery.getDimSize(1) * ranks;
    const int64_t keys = cast<RankedTensorType>(op->getOperand(kKey).getType()).getDimSize(1);
    // The optional segment and document ids follow the backward's grad_output, or the forward's key_valid.
    const unsigned firstOptional = backward ? kGradOutput + 1 : kKeyValid + 1;

    OpBuilder builder(op);
    Location loc = op->getLoc();
    auto withDim = [](Type type, int64_t size) {
      auto ranked = cast<RankedTensorType>(type);
      SmallVector<int64_t> shape(ranked.getShape());
      shape[1] = size;
      return RankedTensorType::get(shape, ranked.getElementType());
    };
    auto slice = [&](Value value, int64_t start, int64_t size) -> Value {
      return builder.create<SliceOp>(loc, withDim(value.getType(), size), value, builder.getI64IntegerAttr(1),
                                     builder.getI64IntegerAttr(start));
    };
    SmallVector<Operation*> chunkOps;
    // A sliding window (W > 0) hides every key more than W - 1 positions before the chunk's first
    // query, so those keys are cut from the front as well.
    const int64_t window = op->getAttrOfType<IntegerAttr>("window").getInt();
    SmallVector<std::pair<int64_t, int64_t>> keyRanges;  // [begin, end) per chunk
    for (int64_t globalChunk : {coordinate, 2 * ranks - 1 - coordinate}) {
      const int64_t local = static_cast<int64_t>(chunkOps.size());
      const int64_t causalEnd = keys - globalQueries + (globalChunk + 1) * chunk;
      const int64_t end = segmented ? keys : causalEnd;
      const int64_t begin = window > 0 && !segmented ? std::max<int64_t>(0, end - chunk - (window - 1)) : 0;
      SmallVector<Value> operands;
      for (OpOperand& operand : op->getOpOperands()) {
        unsigned index = operand.getOperandNumber();
        if (index == kQuery || (backward && index == kGradOutput))
          operands.push_back(slice(operand.get(), local * chunk, chunk));
        else if (index == kKey || index == kValue || index == kKeyValid || index >= firstOptional)
          operands.push_back(slice(operand.get(), begin, end - begin));
        else operands.push_back(operand.get());
      }
      // Cloned after its operands' slices, so that they dominate it.
      Operation* part = builder.clone(*op);
      part->setOperands(operands);
      if (end > causalEnd) part->setAttr("trailing_keys", builder.getI64IntegerAttr(end - causalEnd));
      part->getResult(0).setType(withDim(part->getResult(0).getType(), chunk));
      for (unsigned result = 1; result < part->getNumResults(); ++result)
        part->getResult(result).setType(withDim(part->getResult(result).getType(), end - begin));
      chunkOps.push_back(part);
      keyRanges.push_back({begin, end});
    }
    auto replace = [&](Value old, Value replacement) {
      old.replaceAllUsesWith(replacement);
      producedSharding_[replacement] = producedSharding_[old];
    };
    replace(op->getResult(0),
            builder.create<ConcatOp>(loc, ValueRange{chunkOps[0]->getResult(0), chunkOps[1]->getResult(0)},
                                     builder.getI64IntegerAttr(1)));
    for (unsigned result = 1; result < op->getNumResults(); ++result) {
      Value sum;
      for (auto [part, range] : llvm::zip(chunkOps, keyRanges)) {
        auto [begin, end] = range;
        Value gradient = part->getResult(result);
        auto zeros = [&](int64_t size) -> Value {
          return builder.create<FillOp>(loc, withDim(gradient.getType(), size), builder.getF64FloatAttr(0.0));
        };
        SmallVector<Value> pieces;
        if (begin > 0) pieces.push_back(zeros(begin));
        pieces.push_back(gradient);
        if (end < keys) pieces.push_back(zeros(keys - end));
        if (pieces.size() > 1) gradient = builder.create<ConcatOp>(loc, pieces, builder.getI64IntegerAttr(1));
        sum = sum ? builder.create<AddOp>(loc, gradient.getType(), sum, gradient).getResult() : gradient;
      }
      replace(op->getResult(result), sum);
    }
    replaced_.push_back(op);
    return success();
  }

  // A local mean over dimensions split n ways in all is n times the rank's share of the global
  // mean (the pending sum the result's sharding states), so it is scaled by 1/n.
  void scaleMeanOverSplitDims(ReduceMeanOp mean) {
    ShardingAttr input = shardingAt(mean, kOperandShardingsAttr, 0);
    int64_t blocks = 1;
    for (int64_t dim : mean.getDims()) blocks *= mesh_.splitOf(input, dim);
    if (blocks == 1) return;
    OpBuilder builder(mean->getContext());
    builder.setInsertionPointAfter(mean);
    Value result = mean.getResult();
    auto type = cast<RankedTensorType>(result.getType());
    Value share = builder.create<FillOp>(mean.getLoc(), RankedTensorType::get({}, type.getElementType()),
                                         builder.getF64FloatAttr(1.0 / static_cast<double>(blocks)));
    Value scaled = builder.create<MulOp>(mean.getLoc(), type, result, share);
    result.replaceAllUsesExcept(scaled, scaled.getDefiningOp());
    producedSharding_[scaled] = producedSharding_[result];
  }

  // A maximum over a split dimension is a pending maximum, which no sharding states.
  LogicalResult checkMaximumIsLocal(Operation* op) {
    ShardingAttr input = shardingAt(op, kOperandShardingsAttr, 0);
    for (int64_t dim : op->getAttrOfType<DenseI64ArrayAttr>("dims").asArrayRef())
      if (mesh_.splitOf(input, dim) > 1)
        return op->emitOpError() << "takes the maximum over dimension " << dim << ", which " << input
                                 << " splits: only a sum over a split dimension leaves a pending sum";
    return success();
  }

  LogicalResult checkWhole(Operation* op, unsigned operand, int64_t dim, StringRef verb) {
    ShardingAttr sharding = shardingAt(op, kOperandShardingsAttr, operand);
    if (mesh_.splitOf(sharding, dim) > 1)
      return op->emitOpError() << verb << " dimension " << dim << ", which operand " << operand << "'s " << sharding
                               << " splits";
    return success();
  }

  ModuleOp module_;
  Mesh mesh_;
  int64_t rank_;
  DenseMap<Value, ShardingAttr> producedSharding_;
  // Ops replaced by their context-parallel chunks (localizeQueryBlock), erased after the function.
  SmallVector<Operation*> replaced_;
  // Whether the current function splits sequences over the context axis (Reshard.h).
  bool contextSplitsSequences_ = false;
  // The reshardings built so far in the current function, by value and consumed layout.
  DenseMap<std::pair<Value, Attribute>, Value> resharded_;
};

struct DgShardPartitionPass : mlir::dg::impl::DgShardPartitionBase<DgShardPartitionPass> {
  using DgShardPartitionBase::DgShardPartitionBase;
  void runOnOperation() override {
    if (failed(Partitioner(getOperation(), rank).run())) signalPassFailure();
  }
};

}  // namespace
