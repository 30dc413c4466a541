// Which rank this process is, read from the environment of whatever started it (docs/cli.md,
// "Several ranks"): dgemma-run's own launcher, torchrun, Slurm's srun or Open MPI's mpirun.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace dgemma {

enum class Launcher {
  None,       // started by hand: rank 0 of 1
  DgemmaRun,  // a rank of dgemma-run --nproc-per-node: RANK, WORLD_SIZE, LOCAL_RANK, DGEMMA_RENDEZVOUS_DIR,
              // DGEMMA_LAUNCHER_PID
  Torchrun,   // RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_*
  Mpirun,     // OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
  Slurm,      // SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID
};

const char* launcherName(Launcher launcher);  // "none", "dgemma-run", "torchrun", "mpirun", "slurm"

// The port rank 0 serves the rendezvous on when MASTER_PORT is unset (Slurm, mpirun): torchrun's.
inline constexpr int kDefaultMasterPort = 29500;

struct RankEnvironment {
  Launcher launcher = Launcher::None;
  int64_t rank = 0;
  int64_t worldSize = 1;
  int64_t localRank = 0;
  std::string rendezvousDirectory;  // DgemmaRun: the directory the local ranks meet in
  int64_t launcherPid = 0;          // DgemmaRun: the launcher that started this rank (0: not said)
  std::string masterAddress;        // the others: where the rendezvous store is served
  int masterPort = 0;
  // torchrun: its elastic agent serves the store at MASTER_ADDR:MASTER_PORT
  // (TORCHELASTIC_USE_AGENT_STORE=True), so no rank serves one. The ranks' keys then live under
  // storePrefix, which names the run and the restart, so that a restarted group never reads the
  // keys of the group before it.
  bool agentStore = false;
  std::string storePrefix;
  int64_t restartCount = 0;  // TORCHELASTIC_RESTART_COUNT: how often the agent restarted the group
};

// Looks a variable up: its value, or nothing when it is unset.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvironmentLookup processEnvironment();

// Detection order: DGEMMA_RENDEZVOUS_DIR, then RANK (torchrun), OMPI_COMM_WORLD_RANK, SLURM_PROCID;
// under torchrun also TORCHELASTIC_USE_AGENT_STORE ("True": the agent's store), TORCHELASTIC_RUN_ID,
// and TORCHELASTIC_RESTART_COUNT (each optional; torchrun sets them all);
// none set: rank 0 of 1. A launcher's other variables are then required. The master: MASTER_ADDR,
// else under Slurm the first host of SLURM_JOB_NODELIST (or SLURM_NODELIST), under mpirun
// 127.0.0.1 when every rank runs on this host; the port: MASTER_PORT, else kDefaultMasterPort.
// InputError naming the variable when one is missing or malformed.
RankEnvironment detectRankEnvironment(const EnvironmentLookup& lookup);

// The first host of a Slurm host list: "gpu[07-09,12],login1" -> "gpu07". InputError naming
// `variable` for an empty or malformed list.
std::string firstSlurmHost(const std::string& nodeList, const std::string& variable);

}  // namespace dgemma
