#include "runtime/train/WorldGroup.h"

#include <algorithm>
#include <cstring>

#include "support/Error.h"

namespace dgemma {

WorldGroup::WorldGroup(const Plan& plan, Backend& backend, CommunicatorSet& communicators)
    : backend_(backend), rank_(plan.rank), size_(plan.worldSize) {
  int64_t meshSize = 1;
  for (const MeshAxis& axis : plan.mesh) {
    Communicator& communicator = communicators.axis(axis.name, "the training loop's world group");
    if (communicator.size() != axis.size || communicator.rank() != axis.coord)
      throw InputError("mesh axis " + axis.name + ": the plan places rank " + std::to_string(plan.rank) + " at " +
                       std::to_string(axis.coord) + " of " + std::to_string(axis.size) + ", its communicator at " +
                       std::to_string(communicator.rank()) + " of " + std::to_string(communicator.size()));
    axes_.push_back(&communicator);
    meshSize *= axis.size;
  }
  if (meshSize != size_)
    throw InputError("the plan's mesh holds " + std::to_string(meshSize) + " ranks, its world size is " + std::to_string(size_));
}

// Gathering over the last (fastest) axis first leaves each rank with the values of its run of
// consecutive ranks; each axis further out gathers those runs in its coordinate order, so the
// result is in row-major rank order.
std::vector<int64_t> WorldGroup::allGather(const std::vector<int64_t>& values) {
  if (size_ == 1) return values;
  const int64_t count = static_cast<int64_t>(values.size());
  const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(count, 1) * size_) * sizeof(int64_t);
  void* held = backend_.allocate(bytes, 64);
  void* received = backend_.allocate(bytes, 64);
  std::vector<int64_t> result(static_cast<size_t>(count * size_));
  try {
    if (count > 0) backend_.copyToDevice(held, values.data(), static_cast<uint64_t>(count) * sizeof(int64_t));
    ExecContext context = backend_.context(0);
    int64_t gathered = count;
    for (auto axis = axes_.rbegin(); axis != axes_.rend(); ++axis) {
      if ((*axis)->size() == 1) continue;
      (*axis)->allGather(context, held, received, gathered, DType::I64);
      gathered *= (*axis)->size();
      std::swap(held, received);
    }
    backend_.synchronize();
    if (count > 0) backend_.copyToHost(result.data(), held, result.size() * sizeof(int64_t));
  } catch (...) {
    backend_.deallocate(held);
    backend_.deallocate(received);
    throw;
  }
  backend_.deallocate(held);
  backend_.deallocate(received);
  return result;
}

int64_t WorldGroup::minimum(int64_t value) {
  const std::vector<int64_t> all = allGather({value});
  return *std::min_element(all.begin(), all.end());
}

int64_t WorldGroup::fromRankZero(int64_t value) { return allGather({value}).front(); }

// A rank leaves an axis' barrier only after every rank of its group there has left the barriers of
// the axes before; by induction over the axes, leaving the last means every rank of the mesh has
// entered the first.
void WorldGroup::barrier() {
  for (Communicator* axis : axes_)
    if (axis->size() > 1) axis->barrier();
}

}  // namespace dgemma
