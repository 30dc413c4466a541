// Resharding for one rank's program: the ops that turn the local part of a value laid out as one
// #dg.sharding into its local part under another (docs/parallelism.md, "Partitioning"). Every
// offset is a compile-time constant because the rank is fixed.
#ifndef COMPILER_TRANSFORMS_RESHARD_H
#define COMPILER_TRANSFORMS_RESHARD_H

#include <cstdint>

#include "dialects/dg/IR/DgMesh.h"
#include "mlir/IR/Builders.h"

namespace mlir::dg {

// The load-balanced order of a dimension split over N context ranks, as chunk indices: position 2c
// holds chunk c and position 2c + 1 chunk 2N - 1 - c, so rank c's block is chunks c and 2N - 1 - c.
SmallVector<int64_t> balancedChunkOrder(int64_t ranks);
// The inverse: the position in the balanced order of each chunk of the sequence.
SmallVector<int64_t> sequenceChunkOrder(int64_t ranks);

// Builds, at the builder's insertion point, the ops that take `local` (this rank's part of a value
// sharded as `from`) to this rank's part under `to`, in this order:
//   1. un-split: all_gather of each dimension's axes that `to` does not keep, minor axis first (the
//      block index is row-major over a dimension's axes, so the minor axis' blocks are adjacent);
//   2. split: for each axis `to` adds to a dimension, major first, a reduce_scatter when the value
//      is a pending sum over that axis, a local dg.slice at this rank's block otherwise;
//   3. pending sums that `to` neither keeps nor splits a dimension over: all_reduce, of the block
//      the rank keeps after step 2;
//   4. pending sums that `to` adds: ranks with coordinate 0 on those axes keep the value, the others
//      hold zeros, which keeps the sum exact: a dg.fill for a value computed from sources alone,
//      else zeros that still read the value (so every rank's program has the same dependencies and
//      orders its collectives alike, over several tensor axes or a context axis).
// Collectives act on dim 0; another dimension is moved to the front with dg.transpose and back.
// With `contextSplitsSequences` (an entry point that splits sequences over the context axis), a
// dimension split over an axis with the context role is in the load-balanced order of causal
// context parallelism (docs/parallelism.md, "Context parallelism"): cut into 2N chunks for the
// axis' N ranks, rank c holds chunks c and 2N - 1 - c. The split slices those two chunks, a gather
// over the axis puts the chunks back in sequence order, and a sum is put in the balanced order
// before its reduce-scatter. Without it (optimizer_step, where the context axis shards optimizer
// state as the data axes do) the context axis splits into contiguous blocks like any other.
// Fails, with an error on `user`, when an integer value would need a collective or a pending sum.
FailureOr<Value> buildReshard(OpBuilder& builder, Operation* user, const Mesh& mesh, int64_t rank, Value local,
                              ShardingAttr from, ShardingAttr to, bool contextSplitsSequences);

}  // namespace mlir::dg

#endif
