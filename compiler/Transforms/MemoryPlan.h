// The scratch memory planner of one entry point (dg-memory-plan), callable from the tools: the
// per-pool numbers dgemma-compile --report prints and the layout search compares.
//
// An entry point's scratch storage falls into two pools, each its own arena in the plan:
// activations (every value an op computes, the entry's inputs) and communication buffers (the
// results of collectives that do not work in place, isCommunicationBuffer). Each pool is packed
// twice, by largest-first placement at the lowest free offset and by best-fit over the free blocks
// in program order, and the smaller arena wins.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Pass/Pass.h"

namespace mlir::dg {

struct PoolPacking {
  int64_t largestFirstBytes = 0;  // largest first, each at the lowest free aligned offset
  int64_t bestFitBytes = 0;       // program order, each into the smallest free block that holds it
  int64_t maxLiveBytes = 0;       // the most bytes live at one op (aligned sizes): no packing does better
  int64_t values = 0;             // storage roots in the pool

  int64_t plannedBytes() const { return largestFirstBytes < bestFitBytes ? largestFirstBytes : bestFitBytes; }
  // Arena size over max live bytes (1 when the pool is empty): what the packing wastes.
  double fragmentation() const { return maxLiveBytes == 0 ? 1.0 : double(plannedBytes()) / double(maxLiveBytes); }
};

struct EntryMemoryPlan {
  PoolPacking activations;
  PoolPacking communication;
};

// Plans `function`'s scratch (liveness by op position: inputs live from the start, outputs to the
// end; views and in-place results share their root's storage, storageRoot). With `write`, stores
// dg.offsets on each op with scratch results and dg.scratch_bytes / dg.comm_buffer_bytes on the
// function; without, only computes. `alignment` is a power of two.
EntryMemoryPlan planEntryMemory(func::FuncOp function, int64_t alignment, bool write);

// dg-memory-plan with default options that also hands each entry point's numbers to `observe`
// (dgemma-compile --report reads them so, without planning twice).
using MemoryPlanObserver = std::function<void(func::FuncOp, const EntryMemoryPlan&)>;
std::unique_ptr<Pass> createDgMemoryPlanObserved(MemoryPlanObserver observe);

}  // namespace mlir::dg
