// The NCCL communicator's parts that need no GPU: the unique id's exchange through the rendezvous
// stores, and what a multi-rank `--backend cuda` run reports on a machine that lacks NCCL or a GPU
// (one RuntimeError naming `--backend cuda` and the reason, never a crash at startup: NCCL is
// loaded with dlopen, runtime/comm/NcclLibrary.h). Built with the NCCL communicator (CUDA builds
// whose toolkit has nccl.h); the tests that need the GPU to be absent skip on a machine that has one.
#include <gloo/rendezvous/hash_store.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>

#include "runtime/backends/cuda/CudaBackend.h"
#include "runtime/comm/MeshCommunicators.h"
#include "runtime/comm/NcclCommunicator.h"
#include "runtime/comm/NcclLibrary.h"
#include "runtime/comm/TcpStore.h"
#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

template <typename Body>
std::string runtimeErrorOf(Body&& body) {
  try {
    body();
  } catch (const RuntimeError& error) {
    return error.what();
  }
  return "";
}

TEST(NcclWithoutGpuTest, AMissingLibraryIsAnErrorNamingTheBackendAndTheLibrary) {
  const std::string message = runtimeErrorOf([] { loadNcclLibrary("libdgemma-no-such-nccl.so.2"); });
  EXPECT_NE(message.find("--backend cuda with several ranks needs NCCL"), std::string::npos) << message;
  EXPECT_NE(message.find("libdgemma-no-such-nccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot be loaded"), std::string::npos) << message;
}

TEST(NcclWithoutGpuTest, ALibraryWithoutNcclsEntryPointsIsRefused) {
  // libc loads but is not NCCL: the first missing symbol is named.
  const std::string message = runtimeErrorOf([] { loadNcclLibrary("libc.so.6"); });
  EXPECT_NE(message.find("libc.so.6 has no ncclGetVersion"), std::string::npos) << message;
}

TEST(NcclWithoutGpuTest, TheToolkitsNcclLoadsWithoutADriver) {
  // Loading NCCL needs neither a GPU nor a driver; only its communicators do.
  const NcclLibrary& library = ncclLibrary();
  EXPECT_GE(library.version, 21300);
  EXPECT_NE(library.allReduce, nullptr);
}

// Three ranks as threads, each with its own client of the TcpStore rank 0 serves, as ranks on
// several hosts meet: all get rank 0's id.
TEST(NcclWithoutGpuTest, TheUniqueIdTravelsThroughTheTcpStore) {
  constexpr int64_t kRanks = 3;
  TcpStoreServer server(0, kRanks, 10s);
  std::vector<std::vector<char>> ids(kRanks);
  const std::vector<std::string> failures =
      test::runOnRanks(kRanks, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>&) {
        TcpStore store("127.0.0.1", server.port(), 10s);
        NcclOptions options;
        options.rank = rank;
        options.size = kRanks;
        options.key = "nccl-unique-id/tp@dp=0";
        options.timeout = 10s;
        ids[rank] = exchangeNcclUniqueId(store, options);
      });
  for (int64_t rank = 0; rank < kRanks; ++rank) ASSERT_EQ(failures[rank], "") << "rank " << rank;
  EXPECT_EQ(ids[0].size(), 128u);  // NCCL_UNIQUE_ID_BYTES
  EXPECT_NE(ids[0], std::vector<char>(ids[0].size(), 0));
  EXPECT_EQ(ids[1], ids[0]);
  EXPECT_EQ(ids[2], ids[0]);
}

TEST(NcclWithoutGpuTest, AMissingRankZeroTimesOutNamingTheGroupAndTheKey) {
  gloo::rendezvous::HashStore store;
  NcclOptions options;
  options.rank = 1;
  options.size = 2;
  options.key = "nccl-unique-id/ep@dp=1";
  options.timeout = 200ms;
  options.label = "mesh axis 'ep'";
  const std::string message = runtimeErrorOf([&] { exchangeNcclUniqueId(store, options); });
  EXPECT_NE(message.find("nccl rendezvous of mesh axis 'ep' (rank 1 of 2): waiting for rank 0's NCCL unique id "
                         "('nccl-unique-id/ep@dp=1')"),
            std::string::npos)
      << message;
}

TEST(NcclWithoutGpuTest, AValueThatIsNoUniqueIdIsRefused) {
  gloo::rendezvous::HashStore store;
  store.set("id", {'a', 'b', 'c'});
  NcclOptions options;
  options.rank = 1;
  options.size = 2;
  options.key = "id";
  options.timeout = 1s;
  const std::string message = runtimeErrorOf([&] { exchangeNcclUniqueId(store, options); });
  EXPECT_NE(message.find("the store's 'id' holds 3 bytes, expected an NCCL unique id of 128"), std::string::npos)
      << message;
}

TEST(NcclWithoutGpuTest, CreatingACommunicatorWithoutAGpuNamesTheBackend) {
  std::string reason;
  if (cudaDeviceAvailable(&reason)) GTEST_SKIP() << "a CUDA device is present; the GPU tests cover NCCL";
  gloo::rendezvous::HashStore store;
  NcclOptions options;
  options.label = "mesh axis 'tp'";
  const std::string message = runtimeErrorOf([&] { createNcclCommunicator(store, options); });
  EXPECT_NE(message.find("nccl rendezvous of mesh axis 'tp' (rank 0 of 1)"), std::string::npos) << message;
  EXPECT_NE(message.find("--backend cuda with several ranks needs a usable CUDA device"), std::string::npos) << message;
}

TEST(NcclWithoutGpuTest, InvalidRanksAreInputErrors) {
  gloo::rendezvous::HashStore store;
  NcclOptions options;
  options.size = 0;
  EXPECT_THROW(createNcclCommunicator(store, options), InputError);
  options.size = 2;
  options.rank = 2;
  EXPECT_THROW(createNcclCommunicator(store, options), InputError);
}

// A host-memory backend that calls itself "cuda": connectMesh picks the communicators by the name.
class NamedCudaBackend : public Backend {
 public:
  std::string name() const override { return "cuda"; }
  uint64_t memoryCapacityBytes() const override { return 0; }
  void* allocate(uint64_t, uint64_t) override { return nullptr; }
  void deallocate(void*) override {}
  void copyToDevice(void*, const void*, uint64_t) override {}
  void copyToHost(void*, const void*, uint64_t) override {}
  void fillZero(void*, uint64_t) override {}
  void copyOnDevice(ExecContext&, void*, const void*, uint64_t) override {}
  const KernelRegistry& kernels() const override { return registry_; }
  void prepareStreams(int64_t, int64_t) override {}
  ExecContext context(int64_t stream) override { return ExecContext{stream}; }
  void recordEvent(int64_t, int64_t) override {}
  void waitEvent(int64_t, int64_t) override {}
  void synchronize() override {}

 private:
  KernelRegistry registry_;
};

TEST(NcclWithoutGpuTest, ConnectMeshPicksNcclForTheCudaBackendsAxes) {
  std::string reason;
  if (cudaDeviceAvailable(&reason)) GTEST_SKIP() << "a CUDA device is present; the GPU tests cover NCCL";
  const std::string directory =
      (std::filesystem::temp_directory_path() / ("dgemma-nccl-mesh-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(directory);
  RendezvousOptions rendezvous;
  rendezvous.storeDirectory = directory;
  rendezvous.timeout = 10s;
  MeshAxis tp;
  tp.name = "tp";
  tp.size = 2;
  const std::vector<std::string> failures =
      test::runOnRanks(2, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>&) {
        NamedCudaBackend backend;
        MeshAxis axis = tp;
        axis.coord = rank;
        connectMesh({axis}, backend, rank, 2, rendezvous, "rank plan");
      });
  std::filesystem::remove_all(directory);
  // The tp group needs NCCL on a device; each rank finds it has none before any rendezvous, so each
  // names its own group, never a peer that left the world group's rendezvous early.
  for (int64_t rank = 0; rank < 2; ++rank) {
    EXPECT_NE(failures[rank].find("nccl rendezvous of mesh axis 'tp' (rank " + std::to_string(rank) + " of 2)"),
              std::string::npos)
        << failures[rank];
    EXPECT_NE(failures[rank].find("--backend cuda"), std::string::npos) << failures[rank];
  }
}

}  // namespace
}  // namespace dgemma
