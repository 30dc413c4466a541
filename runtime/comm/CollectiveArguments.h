// The argument checks and the ragged all-to-all arithmetic of a device communicator, as plain
// functions: the NCCL communicator (runtime/comm/NcclCommunicator.h) calls them before it enqueues
// anything, and the unit tests check them on the CPU, the ragged plan against GlooCommunicator's
// allToAllV (the semantics of Communicator::allToAllV).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dgemma {

// InputError "<what>: root: expected a rank in [0, size), got r".
void checkCollectiveRoot(const std::string& what, int64_t root, int64_t groupSize);
// InputError "<what>: count: expected a non-negative element count, got n".
void checkCollectiveCount(const std::string& what, int64_t count);

// One peer's share of a ragged all-to-all as byte ranges of the two buffers: what this rank sends
// to `peer` (send[sendOffset, sendOffset + sendBytes)) and what it receives from it
// (recv[recvOffset, recvOffset + recvBytes)). A zero size means no send (receive) is posted.
struct PeerTransfer {
  int64_t peer = 0;
  uint64_t sendOffset = 0;
  uint64_t sendBytes = 0;
  uint64_t recvOffset = 0;
  uint64_t recvBytes = 0;
};

// The transfers of Communicator::allToAllV, one per peer in rank order (this rank's own block
// included: a send to itself matched by a receive from itself). Counts and offsets are in
// elements of `elementBytes` bytes. InputError naming `what` and the argument when a vector does not
// hold one entry per rank, an entry is negative, or two non-empty receive blocks overlap (the
// order in which peers' blocks land is unspecified, so overlapping blocks would race).
std::vector<PeerTransfer> planRaggedExchange(const std::string& what, int64_t groupSize, uint64_t elementBytes,
                                             const std::vector<int64_t>& sendCounts,
                                             const std::vector<int64_t>& sendOffsets,
                                             const std::vector<int64_t>& recvCounts,
                                             const std::vector<int64_t>& recvOffsets);

}  // namespace dgemma
