// Collectives over Gloo's TCP transport, for CPU runs and multi-rank tests without GPUs. Buffers are
// host memory (the CPU backend's "device" memory); the ExecContext is not used.
//
// Element types: allReduce, reduceScatter and reduceToRoot take f32, f64, i64, i32 and bf16 (bf16 is
// reduced in f32 and rounded to nearest even after each pairwise step, as NCCL does); allGather,
// broadcast and allToAllV move bytes and take every dtype. Other dtypes throw RuntimeError.
//
// A communicator is used by one thread at a time. Every collective takes the next value of a
// per-communicator tag counter, so all ranks must issue the same collectives in the same order
// (which the plan guarantees) and consecutive collectives never mix their messages.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/comm/Communicator.h"

namespace gloo::rendezvous {
class Store;
}

namespace dgemma {

struct GlooOptions {
  // A directory every rank can read and write. Gloo's FileStore leaves its key files behind, so each
  // group needs a directory (or prefix) that no earlier group used.
  std::string storeDirectory;
  std::string prefix;  // namespaces the keys, so several groups can share one directory
  int64_t rank = 0;
  int64_t size = 1;
  std::chrono::milliseconds timeout{30000};  // for the rendezvous and for each collective
  std::string hostname = "127.0.0.1";        // the address this rank listens on
  std::string label;  // what the group is ("mesh axis 'tp'"), named in every error; may be empty
};

// Rendezvous through a FileStore in options.storeDirectory (created if missing): for ranks in
// separate processes. Blocks until all options.size ranks have joined. Throws InputError for an
// invalid rank or size, RuntimeError when the rendezvous fails or times out.
std::unique_ptr<Communicator> createGlooCommunicator(const GlooOptions& options);

// Rendezvous through any Gloo store (a TcpStore, a PrefixStore over one) with every field of
// `options` but storeDirectory.
std::unique_ptr<Communicator> createGlooCommunicator(gloo::rendezvous::Store& store, const GlooOptions& options);

// Rendezvous through any Gloo store, e.g. a HashStore shared by ranks running as threads of one
// process. Binds to 127.0.0.1.
std::unique_ptr<Communicator> createGlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, int64_t rank,
                                                     int64_t size, std::chrono::milliseconds timeout);

}  // namespace dgemma
