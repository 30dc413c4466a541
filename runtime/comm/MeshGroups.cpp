#include "runtime/comm/MeshGroups.h"

#include "support/Error.h"

namespace dgemma {

namespace {

int64_t meshSize(const std::vector<MeshAxis>& mesh) {
  int64_t size = 1;
  for (const MeshAxis& axis : mesh) size *= axis.size;
  return size;
}

// The rank at `coordinates` (row-major, the last axis fastest).
int64_t rankAt(const std::vector<MeshAxis>& mesh, const std::vector<int64_t>& coordinates) {
  int64_t rank = 0;
  for (size_t i = 0; i < mesh.size(); ++i) rank = rank * mesh[i].size + coordinates[i];
  return rank;
}

}  // namespace

std::vector<int64_t> meshCoordinates(const std::vector<MeshAxis>& mesh, int64_t rank) {
  const int64_t size = meshSize(mesh);
  if (rank < 0 || rank >= size)
    throw InputError("rank " + std::to_string(rank) + " is outside the mesh of " + std::to_string(size) + " ranks");
  std::vector<int64_t> coordinates(mesh.size());
  for (size_t i = mesh.size(); i-- > 0;) {
    coordinates[i] = rank % mesh[i].size;
    rank /= mesh[i].size;
  }
  return coordinates;
}

std::vector<AxisGroup> meshAxisGroups(const std::vector<MeshAxis>& mesh, int64_t rank, const std::string& where) {
  const std::vector<int64_t> coordinates = meshCoordinates(mesh, rank);
  for (size_t i = 0; i < mesh.size(); ++i)
    if (mesh[i].coord != coordinates[i])
      throw InputError(where + ": mesh axis '" + mesh[i].name + "': the plan records coordinate " +
                       std::to_string(mesh[i].coord) + ", but rank " + std::to_string(rank) + " has coordinate " +
                       std::to_string(coordinates[i]) + " (row-major over the mesh axes)");
  std::vector<AxisGroup> groups;
  for (size_t i = 0; i < mesh.size(); ++i) {
    AxisGroup group;
    group.axis = mesh[i].name;
    group.position = coordinates[i];
    group.key = mesh[i].name + "@";
    for (size_t j = 0; j < mesh.size(); ++j)
      if (j != i) group.key += (group.key.back() == '@' ? "" : ",") + mesh[j].name + "=" + std::to_string(coordinates[j]);
    std::vector<int64_t> member = coordinates;
    for (int64_t c = 0; c < mesh[i].size; ++c) {
      member[i] = c;
      group.ranks.push_back(rankAt(mesh, member));
    }
    groups.push_back(std::move(group));
  }
  return groups;
}

}  // namespace dgemma
