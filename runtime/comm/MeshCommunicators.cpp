#include "runtime/comm/MeshCommunicators.h"

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>

#include <filesystem>
#include <optional>
#include <stdexcept>

#include "runtime/comm/GlooCommunicator.h"
#include "runtime/comm/LocalAddress.h"
#include "runtime/comm/MeshGroups.h"
#ifdef DGEMMA_HAVE_NCCL
#include "runtime/comm/NcclCommunicator.h"
#endif
#include "runtime/comm/TcpStore.h"
#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"

namespace dgemma {

namespace {

GlooOptions axisGlooOptions(const AxisGroup& group, GlooOptions gloo) {
  gloo.prefix = group.key;
  gloo.label = "mesh axis '" + group.axis + "'";
  gloo.rank = group.position;
  gloo.size = static_cast<int64_t>(group.ranks.size());
  return gloo;
}

#ifdef DGEMMA_HAVE_NCCL
NcclOptions axisNcclOptions(const AxisGroup& group, const GlooOptions& gloo) {
  const GlooOptions axis = axisGlooOptions(group, gloo);
  NcclOptions nccl;
  nccl.rank = axis.rank;
  nccl.size = axis.size;
  nccl.key = "nccl-unique-id/" + group.key;
  nccl.timeout = axis.timeout;
  nccl.label = axis.label;
  return nccl;
}
#endif

// What the device communicators need of this rank alone (NCCL and a usable GPU), checked before the
// first rendezvous: a rank that lacks them fails on its own, and its peers are not left with a
// world group that it hung up on.
void requireAxisCommunicators(const std::vector<AxisGroup>& groups, const Backend& backend, const GlooOptions& gloo) {
  if (backend.name() == "cpu") return;
  for (const AxisGroup& group : groups) {
    if (group.ranks.size() == 1) continue;
#ifdef DGEMMA_HAVE_NCCL
    requireNcclDevice(axisNcclOptions(group, gloo));
#else
    (void)gloo;
    throw RuntimeError("--backend " + backend.name() +
                       ": a run of several ranks needs the NCCL communicator, and "
                       "this dgemma was built without it (no nccl.h in the CUDA toolkit at configure time)");
#endif
  }
}

// The communicator of an axis group of several ranks: Gloo for the CPU backend's host memory, NCCL
// for the CUDA backend's device memory (on the device the backend made current on this thread).
std::unique_ptr<Communicator> connectAxisGroup(gloo::rendezvous::Store& store, const AxisGroup& group,
                                               const Backend& backend, const GlooOptions& gloo) {
  if (backend.name() == "cpu") return createGlooCommunicator(store, axisGlooOptions(group, gloo));
#ifdef DGEMMA_HAVE_NCCL
  return createNcclCommunicator(store, axisNcclOptions(group, gloo));
#else
  throw std::logic_error("connectAxisGroup: requireAxisCommunicators lets no device group through without NCCL");
#endif
}

// Connects the world group, then the axes in mesh order: every rank does the same sequence, and
// the groups of one axis partition the ranks, so each group's rendezvous completes.
MeshCommunicators connectGroups(gloo::rendezvous::Store& store, const std::vector<MeshAxis>& mesh, Backend& backend,
                                int64_t rank, int64_t worldSize, std::chrono::milliseconds timeout,
                                const std::string& hostname, const std::string& where) {
  const std::vector<AxisGroup> groups = meshAxisGroups(mesh, rank, where);
  GlooOptions gloo;
  gloo.timeout = timeout;
  gloo.hostname = hostname;
  requireAxisCommunicators(groups, backend, gloo);
  MeshCommunicators communicators;
  gloo.prefix = "world";
  gloo.label = "the world group";
  gloo.rank = rank;
  gloo.size = worldSize;
  communicators.world = createGlooCommunicator(store, gloo);
  for (const AxisGroup& group : groups) {
    if (group.ranks.size() == 1) {
      communicators.axes.add(group.axis, std::make_unique<LocalCommunicator>(backend));
      continue;
    }
    communicators.axes.add(group.axis, connectAxisGroup(store, group, backend, gloo));
  }
  return communicators;
}

}  // namespace

MeshCommunicators connectMesh(const std::vector<MeshAxis>& mesh, Backend& backend, int64_t rank, int64_t worldSize,
                              const RendezvousOptions& options, const std::string& where) {
  int64_t meshRanks = 1;
  for (const MeshAxis& axis : mesh) meshRanks *= axis.size;
  if (!mesh.empty() && meshRanks != worldSize)
    throw InputError(where + ": the mesh has " + std::to_string(meshRanks) + " ranks, the run has " +
                     std::to_string(worldSize) + " (WORLD_SIZE)");
  if (worldSize == 1) {
    MeshCommunicators communicators;
    for (const MeshAxis& axis : mesh) communicators.axes.add(axis.name, std::make_unique<LocalCommunicator>(backend));
    communicators.world = std::make_unique<LocalCommunicator>();
    return communicators;
  }
  if (backend.name() != "cpu" && backend.name() != "cuda")
    throw InputError("--backend " + backend.name() + ": a run of several ranks needs the cpu backend (Gloo) or the "
                     "cuda backend (NCCL)");
  if (!options.storeDirectory.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.storeDirectory, error);
    if (error) throw RuntimeError(options.storeDirectory + ": cannot create the rendezvous directory: " + error.message());
    MeshCommunicators communicators;
    {
      gloo::rendezvous::FileStore store(options.storeDirectory);
      communicators = connectGroups(store, mesh, backend, rank, worldSize, options.timeout, "127.0.0.1", where);
    }
    // Once every rank is connected nobody reads the store again: rank 0 removes it, so that no exit
    // path (the launcher killed with SIGKILL included) leaves the directory behind.
    communicators.world->barrier();
    if (rank == 0) std::filesystem::remove_all(options.storeDirectory, error);
    return communicators;
  }
  if (options.masterAddress.empty() || options.masterPort <= 0)
    throw InputError("a run of several ranks needs MASTER_ADDR and MASTER_PORT (or a local rendezvous directory)");
  // Without an external store, rank 0 serves one until every rank has finished its rendezvous and
  // let go of it.
  std::optional<TcpStoreServer> server;
  if (rank == 0 && !options.externalStore) server.emplace(options.masterPort, worldSize, options.timeout);
  MeshCommunicators communicators;
  {
    TcpStore tcpStore(options.masterAddress, options.masterPort, options.timeout);
    std::optional<gloo::rendezvous::PrefixStore> prefixed;
    if (!options.keyPrefix.empty()) prefixed.emplace(options.keyPrefix, tcpStore);
    gloo::rendezvous::Store& store = prefixed ? static_cast<gloo::rendezvous::Store&>(*prefixed) : tcpStore;
    communicators = connectGroups(store, mesh, backend, rank, worldSize, options.timeout,
                                  localAddressTowards(options.masterAddress), where);
  }
  return communicators;
}

}  // namespace dgemma
