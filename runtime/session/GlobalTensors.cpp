#include "runtime/session/GlobalTensors.h"

#include <numeric>

#include "support/Error.h"

namespace dgemma {

std::vector<int64_t> globalShapeOf(const NamedBuffer& named, const Plan& plan) {
  return named.isWhole() ? plan.buffers[named.buffer].shape : named.globalShape;
}

ShardBox boxOf(const NamedBuffer& named, const Plan& plan) {
  const std::vector<int64_t>& shape = plan.buffers[named.buffer].shape;
  return named.isWhole() ? wholeBox(shape) : ShardBox{named.shardOffset, shape};
}

HostTensor cutBox(const HostTensor& global, const std::vector<int64_t>& globalShape, const ShardBox& box,
                  const std::string& what) {
  if (global.shape != globalShape)
    throw InputError(what + ": expected the global shape " + shapeToString(globalShape) + ", got " +
                     shapeToString(global.shape));
  if (box == wholeBox(globalShape)) return global;
  HostTensor local(global.dtype, box.shape);
  copyRegion(global.data.data(), wholeBox(globalShape), local.data.data(), box, box, dtypeSize(global.dtype));
  return local;
}

HostTensor assembleGlobal(Communicator& world, const HostTensor& local, const ShardBox& box,
                          const std::vector<int64_t>& globalShape, const std::string& what) {
  if (!boxFitsIn(box, globalShape) || local.shape != box.shape)
    throw RuntimeError(what + ": the box " + describeBox(box) + " of a " + shapeToString(local.shape) +
                       " tensor does not fit the global shape " + shapeToString(globalShape));
  const int64_t ranks = world.size();
  const size_t dims = globalShape.size();
  ExecContext context;  // host memory: the world communicator ignores streams

  // Every rank's box, as (offset..., shape...).
  std::vector<int64_t> mine(box.offset);
  mine.insert(mine.end(), box.shape.begin(), box.shape.end());
  std::vector<int64_t> all(mine.size() * static_cast<size_t>(ranks));
  if (!mine.empty()) world.allGather(context, mine.data(), all.data(), static_cast<int64_t>(mine.size()), DType::I64);
  std::vector<ShardBox> boxes(static_cast<size_t>(ranks));
  for (int64_t r = 0; r < ranks; ++r) {
    auto first = all.begin() + static_cast<std::ptrdiff_t>(2 * dims * static_cast<size_t>(r));
    boxes[r] = {std::vector<int64_t>(first, first + static_cast<std::ptrdiff_t>(dims)),
                std::vector<int64_t>(first + static_cast<std::ptrdiff_t>(dims), first + static_cast<std::ptrdiff_t>(2 * dims))};
  }

  // Each distinct box travels once, from the lowest rank that holds it, to every rank.
  const int64_t elementSize = static_cast<int64_t>(dtypeSize(local.dtype));
  std::vector<bool> sends(static_cast<size_t>(ranks));
  std::vector<ShardBox> pieces;
  std::vector<int64_t> recvCounts, recvOffsets;
  int64_t received = 0;
  for (int64_t r = 0; r < ranks; ++r) {
    sends[r] = firstReplicaRank(boxes, static_cast<int>(r)) == r;
    const int64_t bytes = sends[r] ? boxVolume(boxes[r]) * elementSize : 0;
    if (sends[r]) pieces.push_back(boxes[r]);
    recvCounts.push_back(bytes);
    recvOffsets.push_back(received);
    received += bytes;
  }
  const ShardBox whole = wholeBox(globalShape);
  std::vector<ShardBox> uncovered = uncoveredParts(whole, pieces);
  if (!uncovered.empty())
    throw RuntimeError(what + ": no rank holds the part " + describeBox(uncovered.front()) + " of the global " +
                       shapeToString(globalShape) + " tensor");

  const int64_t myBytes = sends[world.rank()] ? static_cast<int64_t>(local.data.size()) : 0;
  std::vector<int64_t> sendCounts(static_cast<size_t>(ranks), myBytes), sendOffsets(static_cast<size_t>(ranks), 0);
  std::vector<uint8_t> gathered(static_cast<size_t>(received));
  world.allToAllV(context, local.data.data(), sendCounts, sendOffsets, gathered.data(), recvCounts, recvOffsets, DType::U8);

  HostTensor global(local.dtype, globalShape);
  for (int64_t r = 0; r < ranks; ++r)
    if (sends[r])
      copyRegion(gathered.data() + recvOffsets[r], boxes[r], global.data.data(), whole, boxes[r],
                 static_cast<size_t>(elementSize));
  return global;
}

HostTensor sumGlobal(Communicator& world, const HostTensor& local, const ShardBox& box,
                     const std::vector<int64_t>& globalShape, const std::string& what) {
  if (!boxFitsIn(box, globalShape) || local.shape != box.shape)
    throw RuntimeError(what + ": the box " + describeBox(box) + " of a " + shapeToString(local.shape) +
                       " tensor does not fit the global shape " + shapeToString(globalShape));
  HostTensor global(local.dtype, globalShape);
  copyRegion(local.data.data(), box, global.data.data(), wholeBox(globalShape), box, dtypeSize(local.dtype));
  ExecContext context;  // host memory: the world communicator ignores streams
  world.allReduce(context, global.data.data(), global.numElements(), global.dtype, ReduceOp::Sum);
  return global;
}

}  // namespace dgemma
