// dgemma-run on a two-rank plan built here with the C++ API (one dg module lowered per rank, its
// input and output boxes set as the partitioner sets them): --nproc-per-node 2, two ranks started
// by hand with RANK and MASTER_ADDR/MASTER_PORT (no launcher's store: rank 0 serves one), and runs
// where a rank fails or never arrives, which must end every rank within 60 s with a message naming
// the cause. The real torchrun, mpirun and srun are run by test/launchers.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "compiler/Conversion/DgToPlan/DgToPlan.h"
#include "compiler/Pipeline/Pipeline.h"
#include "dialects/dg/IR/DgDialect.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"
#include "plan/PlanFile.h"
#include "runtime/io/Safetensors.h"
#include "test/integration/ToolRunner.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

// Each rank squares its two rows of x; the sum of every square is all-reduced over dp.
constexpr const char* kProgram = R"mlir(
module attributes {dg.mesh = #dg.mesh<[dp = 2 (data)]>} {
func.func @forward() attributes {dg.entry = "forward"} {
  %x = dg.input "x" : tensor<2x3xf32>
  %y = dg.mul %x, %x : tensor<2x3xf32>, tensor<2x3xf32> -> tensor<2x3xf32>
  %r = dg.reduce_sum %y dims = [1] : tensor<2x3xf32> -> tensor<2xf32>
  %s = dg.reduce_sum %r dims = [0] {keep_dims = true} : tensor<2xf32> -> tensor<1xf32>
  %t = dg.all_reduce %s axis = "dp" : tensor<1xf32> -> tensor<1xf32>
  dg.output "y", %y : tensor<2x3xf32>
  dg.output "total", %t : tensor<1xf32>
  return
}
}
)mlir";

// Writes rank-0.dgplan and rank-1.dgplan: x and y are split in rows over dp, total is whole.
void writeTwoRankPlan(const std::string& planDir) {
  std::filesystem::create_directories(planDir);
  for (int64_t rank = 0; rank < 2; ++rank) {
    mlir::MLIRContext context;
    context.loadDialect<mlir::dg::DgDialect, mlir::func::FuncDialect>();
    auto module = mlir::parseSourceString<mlir::ModuleOp>(kProgram, &context);
    ASSERT_TRUE(module);
    ASSERT_TRUE(mlir::succeeded(mlir::dg::runPlanningStage(*module, mlir::dg::PipelineOptions{})));
    mlir::dg::PlanLoweringOptions options;
    options.rank = rank;
    auto plan = mlir::dg::lowerToPlan(*module, options);
    ASSERT_TRUE(mlir::succeeded(plan));
    EntryPoint& entry = plan->entryPoints.at(0);
    for (NamedBuffer* named : {&entry.inputs.at(0), &entry.outputs.at(0)}) {
      ASSERT_TRUE(named->name == "x" || named->name == "y");
      named->globalShape = {4, 3};
      named->shardOffset = {2 * rank, 0};
    }
    writePlanFile(*plan, planFileForRank(planDir, rank));
  }
}

// x = 0, 1, ..., 11 as a [4, 3] batch.
void writeBatch(const std::string& path) {
  HostTensor x(DType::F32, {4, 3});
  std::iota(x.as<float>(), x.as<float>() + 12, 0.0f);
  writeSafetensors(path, {{"x", &x}});
}

void expectAssembledOutputs(const std::string& path) {
  SafetensorsFile file = SafetensorsFile::open(path);
  HostTensor y = file.read("y");
  ASSERT_EQ(y.shape, (std::vector<int64_t>{4, 3}));
  float total = 0;
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(y.as<float>()[i], static_cast<float>(i * i)) << "element " << i;
    total += static_cast<float>(i * i);
  }
  HostTensor sum = file.read("total");
  ASSERT_EQ(sum.numElements(), 1);
  EXPECT_EQ(sum.as<float>()[0], total);
}

// A TCP port nothing listens on now.
int freePort() {
  int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  ::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(probe);
  return ntohs(address.sin_port);
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

class MultiRankRun : public ::testing::Test {
 protected:
  void SetUp() override {
    writeTwoRankPlan(scratch / "plan");
    writeBatch(scratch / "batch.safetensors");
  }
  std::string forward(const std::string& extra) const {
    return std::string(DGEMMA_RUN) + " forward --plan " + scratch / "plan" + " --init random --input " +
           scratch / "batch.safetensors" + " --out " + scratch / "out.safetensors" + " " + extra;
  }

  ScratchDirectory scratch;
};

TEST_F(MultiRankRun, ForwardOnTwoLocalRanksWritesTheGlobalOutputs) {
  ToolResult result = runTool(forward("--nproc-per-node 2"));
  ASSERT_EQ(result.exitCode, 0) << result.output;
  expectAssembledOutputs(scratch / "out.safetensors");
}

// The variables without TORCHELASTIC_USE_AGENT_STORE, as a user sets them by hand across hosts.
TEST_F(MultiRankRun, RanksGivenTheMasterByHandMeetAtRankZerosStore) {
  const std::string environment = "MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(freePort()) +
                                  " WORLD_SIZE=2 ";
  ToolResult result = runTool("(RANK=1 LOCAL_RANK=1 " + environment + forward("") + " & RANK=0 LOCAL_RANK=0 " +
                              environment + forward("") + "; first=$?; wait $!; second=$?; exit $((first + second)))");
  ASSERT_EQ(result.exitCode, 0) << result.output;
  expectAssembledOutputs(scratch / "out.safetensors");
}

TEST_F(MultiRankRun, RefusesAPlanForAnotherNumberOfRanks) {
  ToolResult one = runTool(forward(""));
  EXPECT_EQ(one.exitCode, 2);
  EXPECT_TRUE(contains(one, "holds 2 rank plans, but the run has 1 rank (WORLD_SIZE, --nproc-per-node)")) << one.output;
  ToolResult three = runTool(forward("--nproc-per-node 3"));
  EXPECT_EQ(three.exitCode, 2);
  EXPECT_TRUE(contains(three, "holds 2 rank plans, but the run has 3 ranks")) << three.output;
}

TEST_F(MultiRankRun, ARankThatExitsEarlyStopsTheOthers) {
  std::ofstream(planFileForRank(scratch / "plan", 1), std::ios::trunc) << "not a plan";
  const auto start = std::chrono::steady_clock::now();
  ToolResult result = runTool(forward("--nproc-per-node 2"));
  EXPECT_LT(secondsSince(start), 60.0);
  EXPECT_EQ(result.exitCode, 2) << result.output;
  EXPECT_TRUE(contains(result, "dgemma-run (rank 1): error: ")) << result.output;
  EXPECT_TRUE(contains(result, "dgemma-run: error: rank 1 exited with code 2; stopping the other ranks")) << result.output;
  EXPECT_FALSE(std::filesystem::exists(scratch / "out.safetensors"));
}

TEST_F(MultiRankRun, ARankWhosePeerNeverArrivesTimesOut) {
  const auto start = std::chrono::steady_clock::now();
  ToolResult result = runTool("MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(freePort()) +
                              " WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 " + forward("--comm-timeout 2"));
  EXPECT_LT(secondsSince(start), 30.0);
  EXPECT_EQ(result.exitCode, 1) << result.output;
  EXPECT_TRUE(contains(result, "dgemma-run (rank 0): error: gloo rendezvous of the world group (rank 0 of 2)"))
      << result.output;
}

TEST_F(MultiRankRun, NprocPerNodeUnderTorchrunIsRefused) {
  ToolResult result = runTool("MASTER_ADDR=127.0.0.1 MASTER_PORT=1 WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 " +
                              forward("--nproc-per-node 2"));
  EXPECT_EQ(result.exitCode, 2);
  EXPECT_TRUE(contains(result, "--nproc-per-node: torchrun already started the ranks (rank 0 of 2); leave the flag out"))
      << result.output;
}

}  // namespace
}  // namespace dgemma
