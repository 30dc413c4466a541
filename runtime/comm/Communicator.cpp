#include "runtime/comm/Communicator.h"

#include <stdexcept>

#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"

namespace dgemma {

void CommunicatorSet::add(const std::string& axis, std::unique_ptr<Communicator> communicator) {
  if (!communicator) throw std::invalid_argument("CommunicatorSet: mesh axis '" + axis + "': null communicator");
  if (!byAxis_.emplace(axis, std::move(communicator)).second)
    throw std::invalid_argument("CommunicatorSet: mesh axis '" + axis + "' already has a communicator");
}

Communicator& CommunicatorSet::axis(const std::string& name, const std::string& where) const {
  auto found = byAxis_.find(name);
  if (found == byAxis_.end()) throw InputError(where + ": mesh axis '" + name + "' has no communicator");
  return *found->second;
}

// With one rank the gathered output and this rank's reduced block are both the input itself.
void LocalCommunicator::allGather(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype) {
  if (recv != send) backend_->copyOnDevice(context, recv, send, static_cast<uint64_t>(count) * dtypeSize(dtype));
}

void LocalCommunicator::reduceScatter(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype,
                                      ReduceOp) {
  if (recv != send) backend_->copyOnDevice(context, recv, send, static_cast<uint64_t>(count) * dtypeSize(dtype));
}

}  // namespace dgemma
