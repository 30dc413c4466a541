// What a multi-rank `--backend cuda` run reports on a machine that lacks NCCL or a GPU: one
// RuntimeError naming `--backend cuda` and the reason, never a crash at startup (NCCL is loaded
// with dlopen, runtime/comm/NcclLibrary.h). Built with the NCCL communicator (CUDA builds whose
// toolkit has nccl.h); the tests that need the GPU to be absent skip on a machine that has one.
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

TEST(NcclUnavailableTest, AMissingLibraryIsAnErrorNamingTheBackendAndTheLibrary) {
  const std::string message = runtimeErrorOf([] { loadNcclLibrary("libdgemma-no-such-nccl.so.2"); });
  EXPECT_NE(message.find("--backend cuda with several ranks needs NCCL"), std::string::npos) << message;
  EXPECT_NE(message.find("libdgemma-no-such-nccl.so.2"), std::string::npos) << message;
  EXPECT_NE(message.find("cannot be loaded"), std::string::npos) << message;
}

TEST(NcclUnavailableTest, ALibraryWithoutNcclsEntryPointsIsRefused) {
  // libc loads but is not NCCL: the first missing symbol is named.
  const std::string message = runtimeErrorOf([] { loadNcclLibrary("libc.so.6"); });
  EXPECT_NE(message.find("libc.so.6 has no ncclGetVersion"), std::string::npos) << message;
}

TEST(NcclUnavailableTest, TheToolkitsNcclLoadsWithoutADriver) {
  // Loading NCCL needs neither a GPU nor a driver; only its communicators do.
  const NcclLibrary& library = ncclLibrary();
  EXPECT_GE(library.version, 21300);
  EXPECT_NE(library.allReduce, nullptr);
}

TEST(NcclUnavailableTest, CreatingACommunicatorWithoutAGpuNamesTheBackend) {
  std::string reason;
  if (cudaDeviceAvailable(&reason)) GTEST_SKIP() << "a CUDA device is present; the GPU tests cover NCCL";
  gloo::rendezvous::HashStore store;
  NcclOptions options;
  options.label = "mesh axis 'tp'";
  const std::string message = runtimeErrorOf([&] { createNcclCommunicator(store, options); });
  EXPECT_NE(message.find("nccl rendezvous of mesh axis 'tp' (rank 0 of 1)"), std::string::npos) << message;
  EXPECT_NE(message.find("--backend cuda with several ranks needs a usable CUDA device"), std::string::npos) << message;
}

TEST(NcclUnavailableTest, InvalidRanksAreInputErrors) {
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

TEST(NcclUnavailableTest, ConnectMeshPicksNcclForTheCudaBackendsAxes) {
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
  // The world group (Gloo, host memory) connects; the tp group needs NCCL on a device.
  for (int64_t rank = 0; rank < 2; ++rank) {
    EXPECT_NE(failures[rank].find("nccl rendezvous of mesh axis 'tp' (rank " + std::to_string(rank) + " of 2)"),
              std::string::npos)
        << failures[rank];
    EXPECT_NE(failures[rank].find("--backend cuda"), std::string::npos) << failures[rank];
  }
}

}  // namespace
}  // namespace dgemma
