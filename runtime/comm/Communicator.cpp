#include "runtime/comm/Communicator.h"

#include <cstring>
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

void LocalCommunicator::copy(ExecContext& context, void* to, const void* from, uint64_t bytes) {
  if (backend_) backend_->copyOnDevice(context, to, from, bytes);
  else std::memcpy(to, from, bytes);
}

// With one rank the gathered output and this rank's reduced block are both the input itself.
void LocalCommunicator::allGather(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype) {
  if (recv != send) copy(context, recv, send, static_cast<uint64_t>(count) * dtypeSize(dtype));
}

void LocalCommunicator::reduceScatter(ExecContext& context, const void* send, void* recv, int64_t count, DType dtype,
                                      ReduceOp) {
  if (recv != send) copy(context, recv, send, static_cast<uint64_t>(count) * dtypeSize(dtype));
}

// The one block this rank sends to itself.
void LocalCommunicator::allToAllV(ExecContext& context, const void* send, const std::vector<int64_t>& sendCounts,
                                  const std::vector<int64_t>& sendOffsets, void* recv,
                                  const std::vector<int64_t>& recvCounts, const std::vector<int64_t>& recvOffsets,
                                  DType dtype) {
  if (sendCounts.size() != 1 || sendOffsets.size() != 1 || recvCounts.size() != 1 || recvOffsets.size() != 1)
    throw std::invalid_argument("LocalCommunicator::allToAllV: expected one count and offset per side");
  if (recvCounts[0] != sendCounts[0])
    throw std::invalid_argument("LocalCommunicator::allToAllV: the receive count must equal the send count");
  const uint64_t elementBytes = dtypeSize(dtype);
  const auto* from = static_cast<const uint8_t*>(send) + static_cast<uint64_t>(sendOffsets[0]) * elementBytes;
  auto* to = static_cast<uint8_t*>(recv) + static_cast<uint64_t>(recvOffsets[0]) * elementBytes;
  if (sendCounts[0] != 0 && from != to)
    copy(context, to, from, static_cast<uint64_t>(sendCounts[0]) * elementBytes);
}

}  // namespace dgemma
