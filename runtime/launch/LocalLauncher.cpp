#include "runtime/launch/LocalLauncher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "support/Error.h"

namespace dgemma {

namespace {

constexpr int kMaxLocalRanks = 1024;

// The running ranks, for the signal handler: written before the handlers are installed and only
// cleared (set to 0) afterwards, so the handler reads a consistent array.
pid_t gRankPids[kMaxLocalRanks];
std::atomic<int> gRankCount{0};

void forwardSignal(int signal) {
  for (int i = 0; i < gRankCount.load(); ++i)
    if (gRankPids[i] > 0) ::kill(gRankPids[i], signal);
}

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = ::strsignal(signal);
    return "killed by signal " + std::to_string(signal) + (name ? std::string(" (") + name + ")" : "");
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

bool failed(int status) { return WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0); }

// A fresh directory under TMPDIR (or /tmp) for the ranks' Gloo FileStore.
std::string makeRendezvousDirectory() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/dgemma-rendezvous-XXXXXX";
  std::vector<char> path(pattern.begin(), pattern.end());
  path.push_back('\0');
  if (!::mkdtemp(path.data()))
    throw RuntimeError(pattern + ": cannot create the rendezvous directory: " + std::strerror(errno));
  return path.data();
}

// In the child: becomes rank `rank`; never returns.
[[noreturn]] void execRank(const LocalLaunch& launch, int64_t rank, const std::string& rendezvous, pid_t launcher) {
  // A rank dies with its launcher (SIGTERM when the launcher's thread ends, whatever killed it:
  // kill -9, SIGHUP, a crash), never training on under init with no one watching. The signal
  // survives exec; the check after it catches a launcher that died before it was set.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != launcher) ::_exit(1);
  const std::string processes = std::to_string(launch.processes), self = std::to_string(rank);
  const std::string launcherPid = std::to_string(launcher);
  ::setenv("DGEMMA_LAUNCHER_PID", launcherPid.c_str(), 1);
  ::setenv("RANK", self.c_str(), 1);
  ::setenv("LOCAL_RANK", self.c_str(), 1);
  ::setenv("WORLD_SIZE", processes.c_str(), 1);
  ::setenv("LOCAL_WORLD_SIZE", processes.c_str(), 1);
  ::setenv("DGEMMA_RENDEZVOUS_DIR", rendezvous.c_str(), 1);
  std::vector<char*> argv;
  for (const std::string& argument : launch.command) argv.push_back(const_cast<char*>(argument.c_str()));
  argv.push_back(nullptr);
  ::execv(argv[0], argv.data());
  const std::string message = "dgemma-run: error: rank " + self + ": cannot run " + launch.command[0] + ": " +
                              std::strerror(errno) + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, message.data(), message.size());
  (void)ignored;
  ::_exit(127);
}

}  // namespace

std::string currentExecutable() {
  std::error_code error;
  std::filesystem::path path = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) throw RuntimeError("/proc/self/exe: cannot find this executable: " + error.message());
  return path.string();
}

int runLocalRanks(const LocalLaunch& launch, std::ostream& errors) {
  if (launch.processes < 1 || launch.processes > kMaxLocalRanks)
    throw InputError("--nproc-per-node: expected 1 to " + std::to_string(kMaxLocalRanks) + " ranks, got " +
                     std::to_string(launch.processes));
  if (launch.command.empty()) throw std::invalid_argument("runLocalRanks: empty command");
  const std::string rendezvous = makeRendezvousDirectory();
  const int ranks = static_cast<int>(launch.processes);
  const pid_t launcher = ::getpid();
  for (int rank = 0; rank < ranks; ++rank) {
    pid_t pid = ::fork();
    if (pid < 0) {
      const std::string reason = std::strerror(errno);
      forwardSignal(SIGKILL);
      throw RuntimeError("rank " + std::to_string(rank) + ": cannot start it: " + reason);
    }
    if (pid == 0) execRank(launch, rank, rendezvous, launcher);
    gRankPids[rank] = pid;
    gRankCount = rank + 1;
  }
  // SIGHUP (a closed terminal or ssh session) too: the ranks end with the launcher's session.
  struct sigaction forward {}, previousInterrupt {}, previousTerminate {}, previousHangup {};
  forward.sa_handler = forwardSignal;
  sigemptyset(&forward.sa_mask);
  ::sigaction(SIGINT, &forward, &previousInterrupt);
  ::sigaction(SIGTERM, &forward, &previousTerminate);
  ::sigaction(SIGHUP, &forward, &previousHangup);

  int running = ranks;
  int result = 0;
  bool stopping = false;
  auto stoppedAt = std::chrono::steady_clock::now();
  bool killed = false;
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0 && errno == EINTR) continue;
    if (pid < 0) break;  // no children left
    if (pid == 0) {      // stopping, and some rank still runs
      if (!killed && std::chrono::steady_clock::now() - stoppedAt >= launch.gracePeriod) {
        forwardSignal(SIGKILL);
        killed = true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int rank = 0;
    while (rank < ranks && gRankPids[rank] != pid) ++rank;
    if (rank == ranks) continue;  // not one of ours
    gRankPids[rank] = 0;
    --running;
    if (!stopping && failed(status)) {
      errors << "dgemma-run: error: rank " << rank << " " << describeStatus(status) << "; stopping the other ranks"
             << std::endl;
      result = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
      stopping = true;
      stoppedAt = std::chrono::steady_clock::now();
      forwardSignal(SIGTERM);
    }
  }
  gRankCount = 0;
  ::sigaction(SIGINT, &previousInterrupt, nullptr);
  ::sigaction(SIGTERM, &previousTerminate, nullptr);
  ::sigaction(SIGHUP, &previousHangup, nullptr);
  std::error_code ignored;
  std::filesystem::remove_all(rendezvous, ignored);
  return result;
}

}  // namespace dgemma
