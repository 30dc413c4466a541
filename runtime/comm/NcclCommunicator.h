// Collectives over NCCL, for multi-rank runs of the CUDA backend (docs/parallelism.md, "The
// communicators"). Buffers are device memory of the communicator's device; every collective is
// enqueued on the CUDA stream of the ExecContext it is given (the plan stream of the collective
// step) and returns without waiting for it, so a plan that schedules its collectives on a stream of
// their own, ordered by the step's wait and signal events, overlaps communication with the compute
// on its other streams. exchangeCounts and barrier are host-synchronous: they run on the
// communicator's own stream and wait for it.
//
// Element types: allReduce, reduceScatter and reduceToRoot take f32, f64, bf16, f16, i64, i32, i8
// and u8 (NCCL reduces bf16 and f16 in their own precision, rounding once per step); allGather,
// broadcast and allToAllV move bytes and take every dtype. Other dtypes throw RuntimeError.
//
// Like GlooCommunicator, all ranks of the group must issue the same collectives in the same order
// (which the plan guarantees). NCCL is loaded with dlopen on first use (runtime/comm/NcclLibrary.h).
// This header is plain C++ (no CUDA or NCCL headers).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/comm/Communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace dgemma {

struct NcclOptions {
  int64_t rank = 0;
  int64_t size = 1;
  int device = -1;  // the CUDA device of the buffers; -1: the calling thread's current device
  // Rank 0 of the group publishes NCCL's unique id under this key of the store and the others read
  // it, so it must be the same on every rank of the group and differ between groups.
  std::string key = "nccl-unique-id";
  std::chrono::milliseconds timeout{30000};  // how long a rank waits for rank 0's unique id
  std::string label;  // what the group is ("mesh axis 'tp'"), named in every error; may be empty
};

// Exchanges the unique id through `store` (a TcpStore, a FileStore, a HashStore for ranks that are
// threads of one process), then creates the NCCL communicator: blocks until all options.size ranks
// have joined. Throws InputError for an invalid rank or size, RuntimeError naming `--backend cuda`
// when NCCL or a CUDA device is missing, and RuntimeError naming the group when the id does not
// arrive in time or NCCL fails.
std::unique_ptr<Communicator> createNcclCommunicator(gloo::rendezvous::Store& store, const NcclOptions& options);

// What createNcclCommunicator needs of this rank alone, checked before it talks to any other rank:
// NCCL loads and options.device (or the current device) is usable. Returns the device; throws the
// RuntimeError naming `--backend cuda` that createNcclCommunicator would. A mesh checks this for
// every group before its first rendezvous, so a rank without a GPU reports that, never a peer
// that hung up on it.
int requireNcclDevice(const NcclOptions& options);

// The first half of createNcclCommunicator, which needs NCCL but no GPU: rank 0 creates NCCL's
// unique id and writes it to `store` under options.key; the other ranks wait for it (at most
// options.timeout). Returns the id's bytes, the same on every rank of the group. RuntimeError
// naming options.label and the key when the id does not arrive in time or is malformed.
std::vector<char> exchangeNcclUniqueId(gloo::rendezvous::Store& store, const NcclOptions& options);

}  // namespace dgemma
