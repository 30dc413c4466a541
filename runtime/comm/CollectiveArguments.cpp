#include "runtime/comm/CollectiveArguments.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "support/Error.h"

namespace dgemma {

void checkCollectiveRoot(const std::string& what, int64_t root, int64_t groupSize) {
  if (root < 0 || root >= groupSize)
    throw InputError(what + ": root: expected a rank in [0, " + std::to_string(groupSize) + "), got " +
                     std::to_string(root));
}

void checkCollectiveCount(const std::string& what, int64_t count) {
  if (count < 0) throw InputError(what + ": count: expected a non-negative element count, got " + std::to_string(count));
}

std::vector<PeerTransfer> planRaggedExchange(const std::string& what, int64_t groupSize, uint64_t elementBytes,
                                             const std::vector<int64_t>& sendCounts,
                                             const std::vector<int64_t>& sendOffsets,
                                             const std::vector<int64_t>& recvCounts,
                                             const std::vector<int64_t>& recvOffsets) {
  // Byte offsets must not overflow: every entry times the element size stays below 2^63.
  const int64_t largestEntry = std::numeric_limits<int64_t>::max() / static_cast<int64_t>(std::max<uint64_t>(elementBytes, 1));
  for (const auto& [name, values] : {std::pair{"sendCounts", &sendCounts}, {"sendOffsets", &sendOffsets},
                                     {"recvCounts", &recvCounts}, {"recvOffsets", &recvOffsets}}) {
    if (static_cast<int64_t>(values->size()) != groupSize)
      throw InputError(what + ": " + name + ": expected " + std::to_string(groupSize) + " entries (one per rank), got " +
                       std::to_string(values->size()));
    for (int64_t value : *values)
      if (value < 0 || value > largestEntry / 2)
        throw InputError(what + ": " + name + ": expected entries in [0, " + std::to_string(largestEntry / 2) +
                         "], got " + std::to_string(value));
  }

  std::vector<PeerTransfer> transfers;
  for (int64_t peer = 0; peer < groupSize; ++peer) {
    const auto index = static_cast<size_t>(peer);
    PeerTransfer transfer;
    transfer.peer = peer;
    transfer.sendOffset = static_cast<uint64_t>(sendOffsets[index]) * elementBytes;
    transfer.sendBytes = static_cast<uint64_t>(sendCounts[index]) * elementBytes;
    transfer.recvOffset = static_cast<uint64_t>(recvOffsets[index]) * elementBytes;
    transfer.recvBytes = static_cast<uint64_t>(recvCounts[index]) * elementBytes;
    transfers.push_back(transfer);
  }

  // Receive blocks sorted by offset: each non-empty one must end where or before the next begins.
  std::vector<const PeerTransfer*> receives;
  for (const PeerTransfer& transfer : transfers)
    if (transfer.recvBytes != 0) receives.push_back(&transfer);
  std::sort(receives.begin(), receives.end(),
            [](const PeerTransfer* a, const PeerTransfer* b) { return a->recvOffset < b->recvOffset; });
  for (size_t i = 1; i < receives.size(); ++i) {
    const PeerTransfer& before = *receives[i - 1];
    const PeerTransfer& after = *receives[i];
    if (before.recvOffset + before.recvBytes > after.recvOffset)
      throw InputError(what + ": recvOffsets: the blocks from rank " + std::to_string(before.peer) + " and rank " +
                       std::to_string(after.peer) + " overlap (elements [" + std::to_string(recvOffsets[before.peer]) +
                       ", " + std::to_string(recvOffsets[before.peer] + recvCounts[before.peer]) + ") and [" +
                       std::to_string(recvOffsets[after.peer]) + ", " +
                       std::to_string(recvOffsets[after.peer] + recvCounts[after.peer]) + "))");
  }
  return transfers;
}

}  // namespace dgemma
