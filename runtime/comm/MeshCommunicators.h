// The communicators of one rank of a multi-rank run: one per base axis of the plan's mesh (the
// group of runtime/comm/MeshGroups.h) and one over every rank, after a rendezvous through a store.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plan/Plan.h"
#include "runtime/comm/Communicator.h"

namespace dgemma {

class Backend;

// How the ranks of one run find each other. Local ranks (dgemma-run --nproc-per-node) share a fresh
// directory; ranks started by torchrun, Slurm or mpirun meet at a c10d TCP store (TcpStore.h):
// torchrun's agent's, or the one rank 0 serves.
struct RendezvousOptions {
  std::string storeDirectory;  // set: a Gloo FileStore there, ranks bind to loopback
  std::string masterAddress;   // otherwise: the TCP store at masterAddress:masterPort
  int masterPort = 0;
  bool externalStore = false;  // someone else (torchrun's agent) serves it: rank 0 does not
  std::string keyPrefix;       // every key under this prefix ("" for none)
  // For the rendezvous and for each collective: a rank waits this long for a peer that has gone
  // silent, then fails naming the group.
  std::chrono::milliseconds timeout{30000};
};

struct MeshCommunicators {
  CommunicatorSet axes;                 // one per mesh axis: a LocalCommunicator for an axis of size 1
  std::unique_ptr<Communicator> world;  // every rank, in rank order, on host memory
};

// A run of one rank: LocalCommunicators (the axes' on `backend`, the world's on host memory).
// More: per axis of size > 1 a Gloo communicator (cpu backend: host memory) or an NCCL one (cuda
// backend: device memory, on the device the backend made current), and a Gloo one over the world
// (host memory for either backend). Every rank must call this at the same point; it returns when all have.
// InputError naming `where` for a mesh this rank does not fit, RuntimeError when the rendezvous
// fails or times out, or (naming --backend cuda) when NCCL or a usable device is missing.
MeshCommunicators connectMesh(const std::vector<MeshAxis>& mesh, Backend& backend, int64_t rank, int64_t worldSize,
                              const RendezvousOptions& options, const std::string& where);

}  // namespace dgemma
