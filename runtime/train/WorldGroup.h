// Every rank of a plan's mesh as one group, for the decisions the training loop takes on the host
// and that all ranks must take alike (docs/parallelism.md, "Sharded checkpoints and resume"): which
// rank writes a replicated box, whether a checkpoint save may commit, whether a step has a NaN.
// The mesh's communicators are per base axis; a collective over the whole mesh is a chain of them,
// one per axis.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/Plan.h"
#include "runtime/comm/Communicator.h"
#include "runtime/kernel_api/Backend.h"

namespace dgemma {

class WorldGroup {
 public:
  // `communicators` has one communicator per axis of `plan.mesh` (the Session's); `backend` holds
  // the staging buffers, since a collective moves device memory. Both must outlive the group.
  WorldGroup(const Plan& plan, Backend& backend, CommunicatorSet& communicators);

  int64_t rank() const { return rank_; }
  int64_t size() const { return size_; }

  // Every rank's `values`, in rank order; every rank must pass the same count.
  std::vector<int64_t> allGather(const std::vector<int64_t>& values);
  // The least of every rank's `value`, the same on every rank.
  int64_t minimum(int64_t value);
  // Rank 0's `value` on every rank.
  int64_t fromRankZero(int64_t value);
  // Returns once every rank has called it.
  void barrier();

 private:
  Backend& backend_;
  std::vector<Communicator*> axes_;  // the mesh's axes in plan order, major first
  int64_t rank_ = 0;
  int64_t size_ = 1;
};

}  // namespace dgemma
