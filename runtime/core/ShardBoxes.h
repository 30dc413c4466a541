// Boxes of global tensors, the geometry of sharded checkpoints (docs/parallelism.md, "Sharded
// checkpoints and resume"): a rank holds the elements [offset, offset + shape) of a tensor in every
// dimension, row-major. Loading under another layout assembles each requested box from the saved
// boxes that intersect it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dgemma {

struct ShardBox {
  std::vector<int64_t> offset;
  std::vector<int64_t> shape;

  bool operator==(const ShardBox&) const = default;
};

// The box that is the whole tensor.
ShardBox wholeBox(const std::vector<int64_t>& globalShape);

int64_t boxVolume(const ShardBox& box);

// Whether `box` has the rank of `globalShape`, non-negative extents and lies inside it.
bool boxFitsIn(const ShardBox& box, const std::vector<int64_t>& globalShape);

// The common part of two boxes of the same rank, or nothing when they share no element.
std::optional<ShardBox> intersectBoxes(const ShardBox& a, const ShardBox& b);

// The elements of `request` that no box of `pieces` holds, as disjoint boxes; empty when the pieces
// cover the request.
std::vector<ShardBox> uncoveredParts(const ShardBox& request, const std::vector<ShardBox>& pieces);

// "[0:4, 2:6]": the half-open range of each dimension; "[]" for a scalar.
std::string describeBox(const ShardBox& box);

// Copies the elements of `region` (inside both boxes) from `source`, which holds `sourceBox`
// row-major, to the same elements of `target`, which holds `targetBox`.
void copyRegion(const uint8_t* source, const ShardBox& sourceBox, uint8_t* target, const ShardBox& targetBox,
                const ShardBox& region, size_t elementSize);

// The rank that writes a box held by several ranks (a replicated tensor, or a tensor replicated
// along some mesh axes): the lowest rank holding the same box. `boxOfRank[r]` is rank r's box.
int firstReplicaRank(const std::vector<ShardBox>& boxOfRank, int rank);

}  // namespace dgemma
