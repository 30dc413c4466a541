// Which rank a process is, from the variables of each launcher (docs/cli.md, "Several ranks").
#include <gtest/gtest.h>

#include <map>

#include "runtime/launch/RankEnvironment.h"
#include "support/Error.h"

namespace dgemma {
namespace {

RankEnvironment detect(const std::map<std::string, std::string>& variables) {
  return detectRankEnvironment([&](const std::string& name) -> std::optional<std::string> {
    auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  });
}

std::string errorOf(const std::map<std::string, std::string>& variables) {
  try {
    detect(variables);
  } catch (const InputError& error) {
    return error.what();
  }
  return "accepted";
}

TEST(RankEnvironment, NoLauncherIsRankZeroOfOne) {
  RankEnvironment environment = detect({{"HOME", "/root"}});
  EXPECT_EQ(environment.launcher, Launcher::None);
  EXPECT_EQ(environment.rank, 0);
  EXPECT_EQ(environment.worldSize, 1);
}

TEST(RankEnvironment, DgemmaRunRanksMeetInTheirDirectory) {
  RankEnvironment environment =
      detect({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"DGEMMA_RENDEZVOUS_DIR", "/tmp/r"}});
  EXPECT_EQ(environment.launcher, Launcher::DgemmaRun);
  EXPECT_EQ(environment.rank, 1);
  EXPECT_EQ(environment.worldSize, 2);
  EXPECT_EQ(environment.rendezvousDirectory, "/tmp/r");
  EXPECT_TRUE(environment.masterAddress.empty());
}

TEST(RankEnvironment, Torchrun) {
  RankEnvironment environment = detect({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                        {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"},
                                        {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}});
  EXPECT_EQ(environment.launcher, Launcher::Torchrun);  // torchrun inside a Slurm job: its ranks win
  EXPECT_EQ(environment.rank, 5);
  EXPECT_EQ(environment.worldSize, 8);
  EXPECT_EQ(environment.localRank, 1);
  EXPECT_EQ(environment.masterAddress, "node0");
  EXPECT_EQ(environment.masterPort, 29400);
}

TEST(RankEnvironment, TorchrunWithoutItsAgentStoreHasRankZeroServe) {
  RankEnvironment environment = detect({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                                        {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}});
  EXPECT_FALSE(environment.agentStore);
  EXPECT_EQ(environment.storePrefix, "");
  EXPECT_EQ(environment.restartCount, 0);
}

TEST(RankEnvironment, TorchrunsAgentStoreKeysNameTheRunAndTheRestart) {
  std::map<std::string, std::string> variables = {
      {"RANK", "1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"},
      {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RUN_ID", "job7"}, {"TORCHELASTIC_RESTART_COUNT", "2"}};
  RankEnvironment environment = detect(variables);
  EXPECT_TRUE(environment.agentStore);
  EXPECT_EQ(environment.restartCount, 2);
  EXPECT_EQ(environment.storePrefix, "dgemma/job7/attempt_2");
  variables["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_FALSE(detect(variables).agentStore);
  variables["TORCHELASTIC_RESTART_COUNT"] = "-1";
  EXPECT_EQ(errorOf(variables), "TORCHELASTIC_RESTART_COUNT: expected an integer in [0, 1073741824], got '-1'");
}

TEST(RankEnvironment, TorchrunNeedsTheMaster) {
  EXPECT_EQ(errorOf({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "1"}}),
            "MASTER_ADDR: not set (torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT)");
}

TEST(RankEnvironment, SlurmTakesTheMasterFromTheNodeList) {
  RankEnvironment environment = detect({{"SLURM_PROCID", "3"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                                        {"SLURM_JOB_NODELIST", "gpu[07-09,12],login1"}});
  EXPECT_EQ(environment.launcher, Launcher::Slurm);
  EXPECT_EQ(environment.rank, 3);
  EXPECT_EQ(environment.worldSize, 4);
  EXPECT_EQ(environment.localRank, 1);
  EXPECT_EQ(environment.masterAddress, "gpu07");
  EXPECT_EQ(environment.masterPort, kDefaultMasterPort);
}

TEST(RankEnvironment, SlurmPrefersMasterAddr) {
  RankEnvironment environment = detect({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                                        {"SLURM_NODELIST", "a,b"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "4000"}});
  EXPECT_EQ(environment.masterAddress, "10.0.0.1");
  EXPECT_EQ(environment.masterPort, 4000);
}

TEST(RankEnvironment, MpirunOnOneHostUsesLoopback) {
  RankEnvironment environment = detect({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"},
                                        {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  EXPECT_EQ(environment.launcher, Launcher::Mpirun);
  EXPECT_EQ(environment.rank, 1);
  EXPECT_EQ(environment.worldSize, 2);
  EXPECT_EQ(environment.masterAddress, "127.0.0.1");
  EXPECT_EQ(environment.masterPort, kDefaultMasterPort);
}

TEST(RankEnvironment, MpirunAcrossHostsNeedsMasterAddr) {
  EXPECT_NE(errorOf({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}})
                .find("MASTER_ADDR: not set (under mpirun across hosts"),
            std::string::npos);
}

TEST(RankEnvironment, NamesTheMalformedVariable) {
  EXPECT_EQ(errorOf({{"RANK", "x1"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
            "RANK: expected an integer in [0, 1073741824], got 'x1'");
  EXPECT_EQ(errorOf({{"RANK", "2"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}}),
            "RANK: 2 is not below WORLD_SIZE 2");
  EXPECT_EQ(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODELIST", "a"},
                     {"MASTER_PORT", "70000"}}),
            "MASTER_PORT: expected an integer in [1, 65535], got '70000'");
  EXPECT_EQ(errorOf({{"SLURM_PROCID", "0"}, {"SLURM_LOCALID", "0"}}), "SLURM_NTASKS: not set (srun sets it for each task)");
}

TEST(RankEnvironment, FirstSlurmHost) {
  EXPECT_EQ(firstSlurmHost("node1", "L"), "node1");
  EXPECT_EQ(firstSlurmHost("node1,node2", "L"), "node1");
  EXPECT_EQ(firstSlurmHost("gpu[3]", "L"), "gpu3");
  EXPECT_EQ(firstSlurmHost("a,gpu[01-04]", "L"), "a");
  EXPECT_EQ(firstSlurmHost("gpu[010-012]", "L"), "gpu010");
  EXPECT_THROW(firstSlurmHost("", "L"), InputError);
  EXPECT_THROW(firstSlurmHost("[1-2]", "L"), InputError);
}

}  // namespace
}  // namespace dgemma
