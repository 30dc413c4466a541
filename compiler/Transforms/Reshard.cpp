// The resharding builders of dg-shard-partition (Reshard.h).
#include "compiler/Transforms/Reshard.h"

#include "dialects/dg/IR/DgOps.h"
#include "llvm/ADT/STLExtras.h"

#include <type_traits>

using namespace mlir;
using namespace mlir::dg;

namespace {

// Whether `value` is a source (a parameter, input, constant or fill) seen through views and casts.
bool dependsOnSourcesOnly(Value value) {
  while (Operation* producer = value.getDefiningOp()) {
    if (producer->getNumOperands() == 0) return true;
    if (!isa<ReshapeOp, StopGradientOp, CastOp>(producer)) return false;
    value = producer->getOperand(0);
  }
  return false;
}

// The local value while it is being resharded, with the layout it has reached so far.
class Reshard {
 public:
  Reshard(OpBuilder& builder, Operation* user, const Mesh& mesh, int64_t rank, Value local, ShardingAttr from,
          bool contextSplitsSequences)
      : builder_(builder),
        user_(user),
        mesh_(mesh),
        rank_(rank),
        contextSplitsSequences_(contextSplitsSequences),
        value_(local),
        pending_(from.getPartialAxes()) {
    for (int64_t dim = 0; dim < from.getRank(); ++dim) dims_.push_back(from.getDimAxes(dim));
  }

  LogicalResult run(ShardingAttr to) {
    SmallVector<StringRef> keptPending = to.getPartialAxes();
    // 1. Keep each dimension's longest common prefix of axes; gather the rest, minor first.
    for (int64_t dim = 0; dim < to.getRank(); ++dim) {
      SmallVector<StringRef> target = to.getDimAxes(dim);
      size_t common = 0;
      while (common < dims_[dim].size() && common < target.size() && dims_[dim][common] == target[common]) ++common;
      while (dims_[dim].size() > common) {
        if (failed(collectiveOnDim<AllGatherOp>(dims_[dim].back(), dim))) return failure();
        dims_[dim].pop_back();
      }
    }
    // 2. The splits `to` adds, major first.
    for (int64_t dim = 0; dim < to.getRank(); ++dim) {
      SmallVector<StringRef> target = to.getDimAxes(dim);
      for (size_t index = dims_[dim].size(); index < target.size(); ++index) {
        StringRef axis = target[index];
        if (llvm::is_contained(pending_, axis)) {
          if (failed(collectiveOnDim<ReduceScatterOp>(axis, dim))) return failure();
          llvm::erase(pending_, axis);
        } else {
          sliceOwnBlock(axis, dim);
        }
        dims_[dim].push_back(axis);
      }
    }
    // 3. Sums that end neither pending nor scattered into a dimension, after the splits: each
    // rank then reduces only the block it keeps (a ZeRO-1 gradient over `cp` after its reduce-scatter
    // over the data group).
    auto splitsOver = [&](StringRef axis) {
      for (int64_t dim = 0; dim < to.getRank(); ++dim)
        if (llvm::is_contained(to.getDimAxes(dim), axis)) return true;
      return false;
    };
    for (StringRef axis : SmallVector<StringRef>(pending_))
      if (!llvm::is_contained(keptPending, axis) && !splitsOver(axis)) {
        if (failed(collectiveOnDim<AllReduceOp>(axis, 0))) return failure();
        llvm::erase(pending_, axis);
      }
    // 4. New pending sums: one rank of each group keeps the value.
    bool keeps = true;
    for (StringRef axis : keptPending)
      if (!llvm::is_contained(pending_, axis)) {
        keeps = keeps && *mesh_.coordinate(rank_, axis) == 0;
        pending_.push_back(axis);
      }
    if (!keeps) {
      if (!isa<FloatType>(type().getElementType()))
        return user_->emitOpError() << "consumes an integer value as a pending sum, which has no zeros to stand for it";
      Location loc = user_->getLoc();
      // A value computed from sources alone depends on no collective: a fill stands for it.
      if (dependsOnSourcesOnly(value_)) {
        value_ = builder_.create<FillOp>(loc, type(), builder_.getF64FloatAttr(0.0));
        return success();
      }
      // Otherwise zeros that still read the value: every rank's program then has the same
      // dependencies, from which dg-backward-schedule orders the collectives, and so issues them in
      // one order on every rank (with several tensor axes, or a context axis, a fill let a rank hoist a
      // collective past another group's).
      Value never = builder_.create<ConstantOp>(
          loc, DenseElementsAttr::get(RankedTensorType::get({}, builder_.getI1Type()), false));
      Value zero = builder_.create<FillOp>(loc, RankedTensorType::get({}, type().getElementType()),
                                           builder_.getF64FloatAttr(0.0));
      value_ = builder_.create<SelectOp>(loc, never, value_, zero);
    }
    return success();
  }

  Value value() const { return value_; }

 private:
  RankedTensorType type() const { return cast<RankedTensorType>(value_.getType()); }

  RankedTensorType withDim(RankedTensorType type, int64_t dim, int64_t size) {
    SmallVector<int64_t> shape(type.getShape());
    shape[dim] = size;
    return RankedTensorType::get(shape, type.getElementType());
  }

  // The collective over `axis` applied to dimension `dim`, through a transpose when dim != 0.
  template <typename CollectiveOp>
  LogicalResult collectiveOnDim(StringRef axis, int64_t dim) {
    // A gather moves bytes (integer routing indices too); the reductions need a float type.
    if (!std::is_same_v<CollectiveOp, AllGatherOp> && !isa<FloatType>(type().getElementType()))
      return user_->emitOpError() << "needs a " << CollectiveOp::getOperationName() << " over '" << axis
                                  << "' of the integer value " << type() << ", which collectives do not reduce";
    Location loc = user_->getLoc();
    // Collectives take rank >= 1: a scalar (a loss) is reduced as one element.
    if (type().getRank() == 0) {
      RankedTensorType scalar = type();
      value_ = builder_.create<ReshapeOp>(loc, RankedTensorType::get({1}, scalar.getElementType()), value_);
      if (failed(collectiveOnDim<CollectiveOp>(axis, 0))) return failure();
      value_ = builder_.create<ReshapeOp>(loc, scalar, value_);
      return success();
    }
    int64_t groupSize = *mesh_.axisSize(axis);
    SmallVector<int64_t> toFront{dim};
    for (int64_t d = 0; d < type().getRank(); ++d)
      if (d != dim) toFront.push_back(d);
    // The inverse permutation puts the dimensions back.
    SmallVector<int64_t> fromFront(toFront.size());
    for (auto [position, source] : llvm::enumerate(toFront)) fromFront[source] = static_cast<int64_t>(position);
    // A context axis holds its dimension in the load-balanced order (Reshard.h): the gathered blocks
    // are put back in sequence order, a sum is put in that order before it is scattered.
    if constexpr (std::is_same_v<CollectiveOp, ReduceScatterOp>)
      if (isContextAxis(axis)) permuteChunks(dim, balancedChunkOrder(groupSize));
    if (dim != 0) value_ = transpose(toFront);
    int64_t front = type().getDimSize(0);
    int64_t resultFront = front;
    if constexpr (std::is_same_v<CollectiveOp, AllGatherOp>) resultFront = front * groupSize;
    if constexpr (std::is_same_v<CollectiveOp, ReduceScatterOp>) resultFront = front / groupSize;
    value_ = builder_.create<CollectiveOp>(loc, withDim(type(), 0, resultFront), value_, builder_.getStringAttr(axis),
                                           ReductionKindAttr::get(builder_.getContext(), ReductionKind::Sum));
    if (dim != 0) value_ = transpose(fromFront);
    if constexpr (std::is_same_v<CollectiveOp, AllGatherOp>)
      if (isContextAxis(axis)) permuteChunks(dim, sequenceChunkOrder(groupSize));
    return success();
  }

  // A context axis whose splits are in the load-balanced sequence order (Reshard.h).
  bool isContextAxis(StringRef axis) const {
    return contextSplitsSequences_ && llvm::any_of(mesh_.axes(), [&](const Mesh::Axis& a) {
             return a.name == axis && a.role == AxisRole::Context;
           });
  }

  // Dimension `dim` cut into chunks.size() equal chunks and put together again, chunk chunks[i] at i.
  void permuteChunks(int64_t dim, ArrayRef<int64_t> chunks) {
    const int64_t chunkSize = type().getDimSize(dim) / static_cast<int64_t>(chunks.size());
    SmallVector<Value> pieces;
    for (int64_t chunk : chunks)
      pieces.push_back(builder_.create<SliceOp>(user_->getLoc(), withDim(type(), dim, chunkSize), value_,
                                                static_cast<uint64_t>(dim), static_cast<uint64_t>(chunk * chunkSize)));
    value_ = builder_.create<ConcatOp>(user_->getLoc(), pieces, builder_.getI64IntegerAttr(dim));
  }

  Value transpose(ArrayRef<int64_t> perm) {
    SmallVector<int64_t> shape;
    for (int64_t source : perm) shape.push_back(type().getDimSize(source));
    return builder_.create<TransposeOp>(user_->getLoc(), RankedTensorType::get(shape, type().getElementType()), value_,
                                        perm);
  }

  // This rank's block along `axis` of dimension `dim`: a compile-time slice; over a context axis
  // the two chunks of the load-balanced order.
  void sliceOwnBlock(StringRef axis, int64_t dim) {
    int64_t blockSize = type().getDimSize(dim) / *mesh_.axisSize(axis);
    if (isContextAxis(axis)) permuteChunks(dim, balancedChunkOrder(*mesh_.axisSize(axis)));
    int64_t start = *mesh_.coordinate(rank_, axis) * blockSize;
    value_ = builder_.create<SliceOp>(user_->getLoc(), withDim(type(), dim, blockSize), value_,
                                      static_cast<uint64_t>(dim), static_cast<uint64_t>(start));
  }

  OpBuilder& builder_;
  Operation* user_;
  const Mesh& mesh_;
  int64_t rank_;
  bool contextSplitsSequences_;
  Value value_;
  SmallVector<SmallVector<StringRef>> dims_;
  SmallVector<StringRef> pending_;
};

}  // namespace

SmallVector<int64_t> mlir::dg::balancedChunkOrder(int64_t ranks) {
  SmallVector<int64_t> order;
  for (int64_t c = 0; c < ranks; ++c) {
    order.push_back(c);
    order.push_back(2 * ranks - 1 - c);
  }
  return order;
}

SmallVector<int64_t> mlir::dg::sequenceChunkOrder(int64_t ranks) {
  SmallVector<int64_t> balanced = balancedChunkOrder(ranks), inverse(balanced.size());
  for (auto [position, chunk] : llvm::enumerate(balanced)) inverse[chunk] = static_cast<int64_t>(position);
  return inverse;
}

FailureOr<Value> mlir::dg::buildReshard(OpBuilder& builder, Operation* user, const Mesh& mesh, int64_t rank,
                                        Value local, ShardingAttr from, ShardingAttr to, bool contextSplitsSequences) {
  if (from == to) return local;
  Reshard reshard(builder, user, mesh, rank, local, from, contextSplitsSequences);
  if (failed(reshard.run(to))) return failure();
  return reshard.value();
}
