#include "runtime/launch/RankEnvironment.h"

#include <cstdlib>

#include "support/Error.h"

namespace dgemma {

namespace {

class Variables {
 public:
  explicit Variables(const EnvironmentLookup& lookup) : lookup_(lookup) {}

  bool has(const std::string& name) const { return lookup_(name).has_value(); }

  std::string text(const std::string& name, const std::string& why) const {
    std::optional<std::string> value = lookup_(name);
    if (!value || value->empty()) throw InputError(name + ": not set (" + why + ")");
    return *value;
  }

  int64_t integer(const std::string& name, int64_t minimum, int64_t maximum, const std::string& why) const {
    const std::string value = text(name, why);
    size_t used = 0;
    long long parsed = -1;
    try {
      parsed = std::stoll(value, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != value.size() || parsed < minimum || parsed > maximum)
      throw InputError(name + ": expected an integer in [" + std::to_string(minimum) + ", " + std::to_string(maximum) +
                       "], got '" + value + "'");
    return parsed;
  }

  std::optional<std::string> optional(const std::string& name) const {
    std::optional<std::string> value = lookup_(name);
    if (value && value->empty()) return std::nullopt;
    return value;
  }

 private:
  const EnvironmentLookup& lookup_;
};

constexpr int64_t kMaxRanks = int64_t{1} << 30;
constexpr int64_t kMaxPid = (int64_t{1} << 31) - 1;

// RANK, WORLD_SIZE and LOCAL_RANK under the launcher's names.
void readRank(RankEnvironment& environment, const Variables& variables, const std::string& rank,
              const std::string& worldSize, const std::string& localRank, const std::string& why) {
  environment.worldSize = variables.integer(worldSize, 1, kMaxRanks, why);
  environment.rank = variables.integer(rank, 0, kMaxRanks, why);
  if (environment.rank >= environment.worldSize)
    throw InputError(rank + ": " + std::to_string(environment.rank) + " is not below " + worldSize + " " +
                     std::to_string(environment.worldSize));
  environment.localRank = variables.integer(localRank, 0, environment.worldSize - 1, why);
}

int masterPort(const Variables& variables) {
  if (!variables.optional("MASTER_PORT")) return kDefaultMasterPort;
  return static_cast<int>(variables.integer("MASTER_PORT", 1, 65535, "the rendezvous port"));
}

}  // namespace

const char* launcherName(Launcher launcher) {
  switch (launcher) {
    case Launcher::None: return "none";
    case Launcher::DgemmaRun: return "dgemma-run";
    case Launcher::Torchrun: return "torchrun";
    case Launcher::Mpirun: return "mpirun";
    case Launcher::Slurm: return "slurm";
  }
  return "unknown";
}

EnvironmentLookup processEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

std::string firstSlurmHost(const std::string& nodeList, const std::string& variable) {
  // The first entry ends at the first comma outside brackets; a bracket holds ranges of suffixes.
  const size_t bracket = nodeList.find('[');
  const size_t comma = nodeList.find(',');
  if (bracket == std::string::npos || (comma != std::string::npos && comma < bracket)) {
    std::string host = nodeList.substr(0, comma);
    if (host.empty()) throw InputError(variable + ": expected a Slurm host list, got '" + nodeList + "'");
    return host;
  }
  const size_t close = nodeList.find(']', bracket);
  const std::string prefix = nodeList.substr(0, bracket);
  const std::string ranges = close == std::string::npos ? "" : nodeList.substr(bracket + 1, close - bracket - 1);
  const std::string first = ranges.substr(0, ranges.find_first_of(",-"));
  if (prefix.empty() || first.empty() || first.find_first_not_of("0123456789") != std::string::npos)
    throw InputError(variable + ": expected a Slurm host list such as 'gpu[07-09,12]', got '" + nodeList + "'");
  return prefix + first;
}

RankEnvironment detectRankEnvironment(const EnvironmentLookup& lookup) {
  Variables variables(lookup);
  RankEnvironment environment;
  if (variables.has("DGEMMA_RENDEZVOUS_DIR")) {
    const std::string why = "dgemma-run --nproc-per-node sets it for each rank";
    environment.launcher = Launcher::DgemmaRun;
    readRank(environment, variables, "RANK", "WORLD_SIZE", "LOCAL_RANK", why);
    environment.rendezvousDirectory = variables.text("DGEMMA_RENDEZVOUS_DIR", why);
    if (variables.optional("DGEMMA_LAUNCHER_PID"))
      environment.launcherPid = variables.integer("DGEMMA_LAUNCHER_PID", 1, kMaxPid, why);
    return environment;
  }
  if (variables.has("RANK")) {
    const std::string why = "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT";
    environment.launcher = Launcher::Torchrun;
    readRank(environment, variables, "RANK", "WORLD_SIZE", "LOCAL_RANK", why);
    environment.masterAddress = variables.text("MASTER_ADDR", why);
    environment.masterPort = static_cast<int>(variables.integer("MASTER_PORT", 1, 65535, why));
    if (variables.optional("TORCHELASTIC_RESTART_COUNT"))
      environment.restartCount = variables.integer("TORCHELASTIC_RESTART_COUNT", 0, kMaxRanks, "torchrun's restart count");
    // torch reads the flag as "True" exactly (torch.distributed's _torchelastic_use_agent_store).
    environment.agentStore = variables.optional("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    if (environment.agentStore)
      environment.storePrefix = "dgemma/" + variables.optional("TORCHELASTIC_RUN_ID").value_or("none") + "/attempt_" +
                                std::to_string(environment.restartCount);
    return environment;
  }
  if (variables.has("OMPI_COMM_WORLD_RANK")) {
    const std::string why = "mpirun sets it for each rank";
    environment.launcher = Launcher::Mpirun;
    readRank(environment, variables, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", why);
    if (std::optional<std::string> master = variables.optional("MASTER_ADDR")) {
      environment.masterAddress = *master;
    } else if (variables.optional("OMPI_COMM_WORLD_LOCAL_SIZE") &&
               variables.integer("OMPI_COMM_WORLD_LOCAL_SIZE", 1, kMaxRanks, why) == environment.worldSize) {
      environment.masterAddress = "127.0.0.1";  // every rank on this host
    } else {
      throw InputError("MASTER_ADDR: not set (under mpirun across hosts, export the host of rank 0, e.g. "
                       "mpirun -x MASTER_ADDR=host0)");
    }
    environment.masterPort = masterPort(variables);
    return environment;
  }
  if (variables.has("SLURM_PROCID")) {
    const std::string why = "srun sets it for each task";
    environment.launcher = Launcher::Slurm;
    readRank(environment, variables, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", why);
    if (std::optional<std::string> master = variables.optional("MASTER_ADDR")) {
      environment.masterAddress = *master;
    } else {
      const std::string list = variables.optional("SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
      environment.masterAddress = firstSlurmHost(variables.text(list, "the job's hosts; or set MASTER_ADDR"), list);
    }
    environment.masterPort = masterPort(variables);
    return environment;
  }
  return environment;
}

}  // namespace dgemma
