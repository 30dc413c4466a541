// The mesh geometry of DgMesh.h.
#include "dialects/dg/IR/DgMesh.h"

#include <algorithm>
#include <string>

#include "llvm/ADT/STLExtras.h"

#include "dialects/dg/IR/DgDialect.h"

using namespace mlir;
using namespace mlir::dg;

Mesh Mesh::of(ModuleOp module) {
  Mesh mesh;
  if (auto attr = module ? module->getAttrOfType<MeshAttr>(kMeshAttr) : MeshAttr())
    for (MeshAxisAttr axis : attr.getAxes())
      mesh.axes_.push_back({axis.getName().str(), axis.getSize(), axis.getRole()});
  return mesh;
}

SmallVector<StringRef> Mesh::axesWithRole(AxisRole role) const { return axesWithAnyRole({role}); }

SmallVector<StringRef> Mesh::axesWithAnyRole(ArrayRef<AxisRole> roles) const {
  SmallVector<StringRef> names;
  for (const Axis& axis : axes_)
    if (llvm::is_contained(roles, axis.role)) names.push_back(axis.name);
  return names;
}

int64_t Mesh::worldSize() const {
  int64_t size = 1;
  for (const Axis& axis : axes_) size *= axis.size;
  return size;
}

std::optional<int64_t> Mesh::axisSize(StringRef axis) const {
  for (const Axis& entry : axes_)
    if (entry.name == axis) return entry.size;
  return std::nullopt;
}

SmallVector<int64_t> Mesh::coordinates(int64_t rank) const {
  SmallVector<int64_t> coords(axes_.size(), 0);
  for (int64_t i = static_cast<int64_t>(axes_.size()) - 1; i >= 0; --i) {
    coords[i] = rank % axes_[i].size;
    rank /= axes_[i].size;
  }
  return coords;
}

std::optional<int64_t> Mesh::coordinate(int64_t rank, StringRef axis) const {
  SmallVector<int64_t> coords = coordinates(rank);
  for (auto [index, entry] : llvm::enumerate(axes_))
    if (entry.name == axis) return coords[index];
  return std::nullopt;
}

int64_t Mesh::splitOf(ShardingAttr sharding, int64_t dim) const {
  int64_t split = 1;
  for (StringRef axis : sharding.getDimAxes(dim)) split *= axisSize(axis).value_or(1);
  return split;
}

LogicalResult Mesh::verify(ShardingAttr sharding, RankedTensorType type,
                           function_ref<InFlightDiagnostic()> emitError) const {
  if (sharding.getRank() != type.getRank())
    return emitError() << "sharding " << sharding << " has rank " << sharding.getRank() << ", the value's type is "
                       << type;
  for (StringRef axis : sharding.getUsedAxes())
    if (!axisSize(axis)) return emitError() << "sharding " << sharding << " names mesh axis '" << axis
                                            << "', which the module's dg.mesh does not declare";
  for (int64_t dim = 0; dim < type.getRank(); ++dim) {
    int64_t split = splitOf(sharding, dim);
    if (type.getDimSize(dim) % split != 0)
      return emitError() << "sharding " << sharding << " splits dimension " << dim << " of " << type << " " << split
                         << " ways, which does not divide it";
  }
  return success();
}

SmallVector<int64_t> Mesh::localShape(ShardingAttr sharding, ArrayRef<int64_t> globalShape) const {
  SmallVector<int64_t> shape(globalShape);
  for (int64_t dim = 0; dim < sharding.getRank(); ++dim) shape[dim] /= splitOf(sharding, dim);
  return shape;
}

SmallVector<int64_t> Mesh::shardOffset(ShardingAttr sharding, ArrayRef<int64_t> globalShape, int64_t rank) const {
  SmallVector<int64_t> local = localShape(sharding, globalShape);
  SmallVector<int64_t> offset(globalShape.size(), 0);
  for (int64_t dim = 0; dim < sharding.getRank(); ++dim) {
    int64_t block = 0;
    for (StringRef axis : sharding.getDimAxes(dim)) block = block * *axisSize(axis) + *coordinate(rank, axis);
    offset[dim] = block * local[dim];
  }
  return offset;
}

std::optional<LayoutGroups> mlir::dg::layoutGroups(int64_t tensorParallel, int64_t dataParallel, int64_t expertParallel,
                                                   int64_t contextParallel, ArrayRef<int64_t> sharedHeadSplits) {
  if (tensorParallel < 1 || dataParallel < 1 || expertParallel < 1 || contextParallel < 1) return std::nullopt;
  if (dataParallel % expertParallel != 0) return std::nullopt;
  if (expertParallel > 1 && expertParallel % tensorParallel != 0) return std::nullopt;
  // The tensor group's cuts: every split of a shared-head weight below TP, then TP itself; each must
  // divide the next so that the axes between consecutive cuts nest.
  SmallVector<int64_t> cuts;
  for (int64_t split : sharedHeadSplits)
    if (split < tensorParallel) cuts.push_back(split);
  llvm::sort(cuts);
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  cuts.push_back(tensorParallel);
  SmallVector<int64_t> tensorAxisSizes;
  int64_t previous = 1;
  for (int64_t cut : cuts) {
    if (cut < 1 || cut % previous != 0) return std::nullopt;
    if (cut / previous > 1) tensorAxisSizes.push_back(cut / previous);
    previous = cut;
  }
  int64_t epInner = expertParallel > 1 ? expertParallel / tensorParallel : 1;
  LayoutGroups groups;
  auto add = [&](StringRef name, int64_t size, AxisRole role) {
    if (size > 1) groups.axes.push_back({name.str(), size, role});
    return size > 1;
  };
  bool hasDp = add("dp", dataParallel / epInner, AxisRole::Data), hasEp = add("ep", epInner, AxisRole::Expert),
       hasCp = add("cp", contextParallel, AxisRole::Context);
  SmallVector<std::string> tensor;
  for (auto [index, size] : llvm::enumerate(tensorAxisSizes)) {
    tensor.push_back(index == 0 ? std::string("tp") : "tp" + std::to_string(index));
    add(tensor.back(), size, AxisRole::Tensor);
  }
  const bool hasTp = !tensor.empty();
  if (hasDp) groups.data.push_back("dp");
  if (hasEp) groups.data.push_back("ep");
  llvm::append_range(groups.tensor, tensor);
  if (hasEp) groups.expert.push_back("ep");
  if (expertParallel > 1 && hasTp) llvm::append_range(groups.expert, tensor);
  if (hasDp) groups.expertData.push_back("dp");
  if (expertParallel == 1 && hasTp) llvm::append_range(groups.expertData, tensor);
  if (hasCp) groups.context.push_back("cp");
  return groups;
}

MeshAttr mlir::dg::meshAttr(MLIRContext* context, ArrayRef<Mesh::Axis> axes) {
  SmallVector<MeshAxisAttr> entries;
  for (const Mesh::Axis& axis : axes) entries.push_back(MeshAxisAttr::get(context, axis.name, axis.size, axis.role));
  return MeshAttr::get(context, entries);
}
