// The communicator groups of a mesh (docs/parallelism.md, "Meshes"): a plan lists its base axes in
// `plan.mesh`, and a rank's coordinates are row-major over them in that order, the last axis
// fastest. The group of an axis is the ranks that differ from this rank only in that axis'
// coordinate, ordered by it, so group position = coordinate.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/Plan.h"

namespace dgemma {

struct AxisGroup {
  std::string axis;
  std::vector<int64_t> ranks;  // global ranks, ordered by their coordinate on `axis`
  int64_t position = 0;        // this rank's coordinate on `axis`, its index in `ranks`
  // The same on every rank of the group and different for every other group of the mesh: the axis
  // and the coordinates of the other axes ("tp@dp=1,ep=0"). Rendezvous keys are namespaced by it.
  std::string key;
};

// The row-major coordinates of `rank` over the axes of `mesh`. InputError when `rank` is outside
// the mesh (a mesh without axes has one rank).
std::vector<int64_t> meshCoordinates(const std::vector<MeshAxis>& mesh, int64_t rank);

// One group per axis of `mesh`, in the mesh's order. InputError naming `where` when a plan's
// recorded coordinate (MeshAxis::coord) differs from the one its rank has in the row-major order.
std::vector<AxisGroup> meshAxisGroups(const std::vector<MeshAxis>& mesh, int64_t rank, const std::string& where);

}  // namespace dgemma
