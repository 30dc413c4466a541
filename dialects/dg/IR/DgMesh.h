// The module's device mesh (dg.mesh, a #dg.mesh) and the geometry of a #dg.sharding over it: which
// block of a global tensor a rank holds. The mesh's axes are orthogonal "base" axes, row-major in
// the order the attribute lists them, the last axis fastest; each carries a role (data, expert,
// tensor, context) by which passes find it. The logical groups of a parallel layout (dense DP, TP,
// EP, expert DP) are unions of them (docs/parallelism.md, "Meshes").
#ifndef DIALECTS_DG_IR_DGMESH_H
#define DIALECTS_DG_IR_DGMESH_H

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "dialects/dg/IR/DgAttrs.h"
#include "llvm/ADT/SmallVector.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/BuiltinTypes.h"

namespace mlir::dg {

class Mesh {
 public:
  struct Axis {
    std::string name;
    int64_t size;
    AxisRole role;
    bool operator==(const Axis&) const = default;
  };

  Mesh() = default;
  explicit Mesh(ArrayRef<Axis> axes) : axes_(axes) {}
  // The module's dg.mesh; a module without one is a mesh of one rank.
  static Mesh of(ModuleOp module);

  // Major to minor: the order that numbers the ranks.
  ArrayRef<Axis> axes() const { return axes_; }
  // The names of the axes that carry `role` (or any of `roles`), in the mesh's order.
  SmallVector<StringRef> axesWithRole(AxisRole role) const;
  SmallVector<StringRef> axesWithAnyRole(ArrayRef<AxisRole> roles) const;
  int64_t worldSize() const;
  std::optional<int64_t> axisSize(StringRef axis) const;
  // Rank r's coordinate on every axis, in the mesh's order.
  SmallVector<int64_t> coordinates(int64_t rank) const;
  std::optional<int64_t> coordinate(int64_t rank, StringRef axis) const;

  // How many blocks `sharding` cuts dimension `dim` into (the product of its axes' sizes).
  int64_t splitOf(ShardingAttr sharding, int64_t dim) const;
  // Whether every axis of `sharding` is a mesh axis, its rank is the type's and each split
  // dimension divides evenly; emits an error naming what does not fit.
  LogicalResult verify(ShardingAttr sharding, RankedTensorType type, function_ref<InFlightDiagnostic()> emitError) const;
  // The shape one rank holds.
  SmallVector<int64_t> localShape(ShardingAttr sharding, ArrayRef<int64_t> globalShape) const;
  // Where rank `rank`'s block starts in the global tensor.
  SmallVector<int64_t> shardOffset(ShardingAttr sharding, ArrayRef<int64_t> globalShape, int64_t rank) const;

 private:
  SmallVector<Axis> axes_;
};

// Set by the model on a column-split dg.param whose rows are attention heads that several query
// heads share (k_proj, v_proj): how many heads dim 0 holds. Tensor parallelism splits such a weight
// only over the tensor axes that keep whole heads and replicates each head over the rest
// (docs/parallelism.md, "Tensor parallelism beyond the KV heads"; layoutGroups below).
inline constexpr llvm::StringLiteral kHeadsAttr = "dg.heads";

// Set by the model on the op whose result 0 is an encoder pass's input hidden states [B, T, H]: with
// context parallelism its consumers take T split over the context axes (docs/parallelism.md,
// "Context parallelism"); dg-shard-propagate reads it, and it means nothing without a context axis.
inline constexpr llvm::StringLiteral kContextSplitAttr = "dg.context_split";

// A Megatron-style parallel layout as base axes and the logical groups built from them (contract of
// docs/parallelism.md, "Meshes"): world = CP x TP x DP = CP x EDP x EP, TP fastest, then CP, EP
// groups of consecutive ranks of one CP coordinate. Base axes (size-1 ones dropped), in this order:
// `dp` (role data; DP / epInner), `ep` (role expert; epInner: EP / TP when TP > 1, else EP; absent
// when EP = 1), `cp` (role context) and `tp` (role tensor). This is the one place that names mesh
// axes. Requires TP to divide EP when EP > 1.
// Tensor parallelism beyond the KV heads (docs/parallelism.md): when a weight of shared heads
// (dg.heads) splits only s < TP ways, the tensor group is several axes, `tp` (size s), then `tp1`
// (TP / s), one more per further such split, so that the weight splits over a prefix of them and is
// replicated over the rest; the ranks keep their order (the axes nest, row-major).
struct LayoutGroups {
  SmallVector<Mesh::Axis> axes;         // the dg.mesh, outer to inner
  SmallVector<std::string> data;        // dense data parallel: {dp, ep}
  SmallVector<std::string> tensor;      // {tp}, or {tp, tp1, ...} (outer to inner) with replicated heads
  SmallVector<std::string> expert;      // {ep} plus {tp} when EP > 1 and TP > 1
  SmallVector<std::string> expertData;  // {dp}, plus {tp} when EP = 1 and TP > 1
  // {cp}: the encoder's sequence splits over it, and, as in Megatron, its ranks join the data group
  // and the expert-data group in the gradient reduction and the optimizer-state sharding.
  SmallVector<std::string> context;
};
// Fails (nullopt) when the sizes are not positive, EP does not divide DP, EP > 1 and TP does not
// divide it, or the splits in `sharedHeadSplits` below TP do not form a chain of divisors of TP.
// contextParallel comes before sharedHeadSplits: both have defaults, and an integer converts
// silently to a one-element ArrayRef, so every call site names the context size when it passes splits.
std::optional<LayoutGroups> layoutGroups(int64_t tensorParallel, int64_t dataParallel, int64_t expertParallel,
                                         int64_t contextParallel = 1, ArrayRef<int64_t> sharedHeadSplits = {});

// The dg.mesh attribute of these axes, in their order.
MeshAttr meshAttr(MLIRContext* context, ArrayRef<Mesh::Axis> axes);

}  // namespace mlir::dg

#endif
