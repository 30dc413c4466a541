// An entry point's inputs and outputs as global tensors on a sharded plan (docs/plan-format.md,
// "Header": inputs and outputs): every rank reads the same global batch and feeds its box of each input,
// and each output is assembled from the ranks' boxes.
#pragma once

#include <string>
#include <vector>

#include "plan/Plan.h"
#include "runtime/comm/Communicator.h"
#include "runtime/core/HostTensor.h"
#include "runtime/core/ShardBoxes.h"

namespace dgemma {

// The tensor an input or output is (a box of): its global shape, the buffer's when it is whole.
std::vector<int64_t> globalShapeOf(const NamedBuffer& named, const Plan& plan);

// The box of the global tensor that this rank's buffer holds (the whole tensor when unsharded).
ShardBox boxOf(const NamedBuffer& named, const Plan& plan);

// The elements of `box` of `global`. InputError naming `what` when `global` does not have
// `globalShape`.
HostTensor cutBox(const HostTensor& global, const std::vector<int64_t>& globalShape, const ShardBox& box,
                  const std::string& what);

// The global tensor of `globalShape` from every rank's box: `local` holds this rank's `box`. A
// collective over `world` (every rank calls it with the same tensor, in the same order); each
// rank gets the whole tensor. A box held by several ranks comes from the lowest of them.
// RuntimeError naming `what` when the ranks' boxes leave part of the tensor uncovered.
HostTensor assembleGlobal(Communicator& world, const HostTensor& local, const ShardBox& box,
                          const std::vector<int64_t>& globalShape, const std::string& what);

// The global tensor whose value is the sum over the ranks of the boxes they hold (a parameter stored
// as a pending sum, plan::Parameter::pendingSum), on every rank: each rank's box in zeros, summed
// over `world`. Float tensors only.
HostTensor sumGlobal(Communicator& world, const HostTensor& local, const ShardBox& box,
                     const std::vector<int64_t>& globalShape, const std::string& what);

}  // namespace dgemma
