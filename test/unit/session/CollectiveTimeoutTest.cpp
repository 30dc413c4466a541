// A rank whose peer never arrives at a collective fails after the rendezvous timeout, naming the
// entry, the step and the mesh axis, instead of waiting forever.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "runtime/comm/MeshCommunicators.h"
#include "runtime/exec/Executor.h"
#include "runtime/kernel_api/Backend.h"
#include "support/Error.h"
#include "test/unit/comm/GlooRanks.h"

namespace dgemma {
namespace {

using namespace std::chrono_literals;

// forward: all_reduce over tp of the input x, in place.
Plan allReducePlan(int64_t rank) {
  Plan plan;
  plan.producer = "test";
  plan.rank = rank;
  plan.worldSize = 2;
  plan.mesh = {{"tp", 2, rank}};
  plan.arenas = {{"scratch", false, 64, 64}};
  plan.buffers = {{0, "x", DType::F32, {4}, 0, 0, Lifetime{"forward", 0, 0}, std::nullopt}};
  EntryPoint entry;
  entry.name = "forward";
  entry.inputs = {{"x", 0}};
  entry.outputs = {{"x", 0}};
  Step step;
  step.kind = Step::Kind::Collective;
  step.op = "all_reduce";
  step.attrs = {{"reduce", "sum"}};
  step.axis = "tp";
  step.inputs = {0};
  step.outputs = {0};
  step.location = "model.mlir:7:3";
  entry.steps = {step};
  plan.entryPoints = {entry};
  return plan;
}

TEST(CollectiveTimeout, NamesTheStepAndTheAxis) {
  const std::string directory =
      (std::filesystem::temp_directory_path() / ("dgemma-timeout-" + std::to_string(::getpid()))).string();
  std::filesystem::remove_all(directory);
  RendezvousOptions rendezvous;
  rendezvous.storeDirectory = directory;
  rendezvous.timeout = 1s;
  std::string error;
  std::chrono::duration<double> waited{};
  const std::vector<std::string> failures =
      test::runOnRanks(2, [&](int64_t rank, const std::shared_ptr<gloo::rendezvous::Store>&) {
        std::unique_ptr<Backend> backend = createBackend("cpu", 1);
        Plan plan = allReducePlan(rank);
        MeshCommunicators communicators = connectMesh(plan.mesh, *backend, rank, 2, rendezvous, "rank plan");
        Executor executor(plan, *backend, communicators.axes, "rank-" + std::to_string(rank) + ".dgplan");
        if (rank == 1) {  // joined, but never reaches the collective while rank 0 waits
          std::this_thread::sleep_for(3s);
          return;
        }
        HostTensor x(DType::F32, {4});
        const auto start = std::chrono::steady_clock::now();
        try {
          executor.run(plan.entryPoints[0], {{"x", x}});
        } catch (const RuntimeError& failure) {
          error = failure.what();
        }
        waited = std::chrono::steady_clock::now() - start;
      });
  std::filesystem::remove_all(directory);
  EXPECT_EQ(failures[0], "");
  EXPECT_NE(error.find("rank-0.dgplan: entry forward: step 0 (all_reduce at model.mlir:7:3): gloo allReduce over mesh "
                       "axis 'tp' (rank 0 of 2)"),
            std::string::npos)
      << error;
  EXPECT_LT(waited.count(), 2.9) << "the collective should time out after about 1 s";
}

}  // namespace
}  // namespace dgemma
