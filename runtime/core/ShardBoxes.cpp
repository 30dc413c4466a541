#include "runtime/core/ShardBoxes.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "support/Shape.h"

namespace dgemma {

ShardBox wholeBox(const std::vector<int64_t>& globalShape) {
  return ShardBox{std::vector<int64_t>(globalShape.size(), 0), globalShape};
}

int64_t boxVolume(const ShardBox& box) { return numElementsOf(box.shape); }

bool boxFitsIn(const ShardBox& box, const std::vector<int64_t>& globalShape) {
  if (box.offset.size() != globalShape.size() || box.shape.size() != globalShape.size()) return false;
  for (size_t d = 0; d < globalShape.size(); ++d)
    if (box.offset[d] < 0 || box.shape[d] < 0 || box.offset[d] + box.shape[d] > globalShape[d]) return false;
  return true;
}

std::optional<ShardBox> intersectBoxes(const ShardBox& a, const ShardBox& b) {
  ShardBox common;
  for (size_t d = 0; d < a.shape.size(); ++d) {
    int64_t begin = std::max(a.offset[d], b.offset[d]);
    int64_t end = std::min(a.offset[d] + a.shape[d], b.offset[d] + b.shape[d]);
    if (end <= begin) return std::nullopt;
    common.offset.push_back(begin);
    common.shape.push_back(end - begin);
  }
  return common;
}

namespace {

// `from` without `hole`: one slab below and one above the hole in each dimension, each slab
// clipped to the hole in the dimensions before it, so the slabs are disjoint.
std::vector<ShardBox> subtractBox(const ShardBox& from, const ShardBox& hole) {
  std::optional<ShardBox> common = intersectBoxes(from, hole);
  if (!common) return {from};
  std::vector<ShardBox> parts;
  ShardBox rest = from;
  for (size_t d = 0; d < from.shape.size(); ++d) {
    int64_t restEnd = rest.offset[d] + rest.shape[d];
    int64_t holeEnd = common->offset[d] + common->shape[d];
    if (common->offset[d] > rest.offset[d]) {
      ShardBox below = rest;
      below.shape[d] = common->offset[d] - rest.offset[d];
      parts.push_back(below);
    }
    if (holeEnd < restEnd) {
      ShardBox above = rest;
      above.offset[d] = holeEnd;
      above.shape[d] = restEnd - holeEnd;
      parts.push_back(above);
    }
    rest.offset[d] = common->offset[d];
    rest.shape[d] = common->shape[d];
  }
  return parts;
}

}  // namespace

std::vector<ShardBox> uncoveredParts(const ShardBox& request, const std::vector<ShardBox>& pieces) {
  std::vector<ShardBox> uncovered;
  if (boxVolume(request) > 0) uncovered.push_back(request);
  for (const ShardBox& piece : pieces) {
    std::vector<ShardBox> remaining;
    for (const ShardBox& part : uncovered)
      for (ShardBox& left : subtractBox(part, piece)) remaining.push_back(std::move(left));
    uncovered = std::move(remaining);
  }
  return uncovered;
}

std::string describeBox(const ShardBox& box) {
  std::string text = "[";
  for (size_t d = 0; d < box.shape.size(); ++d) {
    if (d) text += ", ";
    text += std::to_string(box.offset[d]) + ":" + std::to_string(box.offset[d] + box.shape[d]);
  }
  return text + "]";
}

void copyRegion(const uint8_t* source, const ShardBox& sourceBox, uint8_t* target, const ShardBox& targetBox,
                const ShardBox& region, size_t elementSize) {
  const size_t rank = region.shape.size();
  if (boxVolume(region) == 0) return;
  // Row-major strides (in elements) of both boxes.
  std::vector<int64_t> sourceStride(rank, 1), targetStride(rank, 1);
  for (size_t d = rank; d-- > 1;) {
    sourceStride[d - 1] = sourceStride[d] * sourceBox.shape[d];
    targetStride[d - 1] = targetStride[d] * targetBox.shape[d];
  }
  // The innermost dimension is contiguous in both: copy it as one run per index of the others.
  const size_t runBytes = (rank ? static_cast<size_t>(region.shape[rank - 1]) : 1) * elementSize;
  std::vector<int64_t> index(rank, 0);  // position within the region, innermost dimension fixed at 0
  for (;;) {
    int64_t sourceElement = 0, targetElement = 0;
    for (size_t d = 0; d < rank; ++d) {
      sourceElement += (region.offset[d] + index[d] - sourceBox.offset[d]) * sourceStride[d];
      targetElement += (region.offset[d] + index[d] - targetBox.offset[d]) * targetStride[d];
    }
    std::memcpy(target + targetElement * elementSize, source + sourceElement * elementSize, runBytes);
    // Next index over every dimension but the innermost.
    size_t d = rank > 0 ? rank - 1 : 0;
    while (d > 0 && ++index[d - 1] == region.shape[d - 1]) {
      index[d - 1] = 0;
      --d;
    }
    if (d == 0) return;
  }
}

int firstReplicaRank(const std::vector<ShardBox>& boxOfRank, int rank) {
  if (rank < 0 || static_cast<size_t>(rank) >= boxOfRank.size())
    throw std::invalid_argument("firstReplicaRank: rank " + std::to_string(rank) + " is not among " +
                                std::to_string(boxOfRank.size()) + " ranks");
  for (int r = 0; r < rank; ++r)
    if (boxOfRank[r] == boxOfRank[rank]) return r;
  return rank;
}

}  // namespace dgemma
