#include "runtime/rl/reward/RewardCommand.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <string_view>

#include "support/Error.h"
#include "support/Json.h"

extern char** environ;

namespace dgemma {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kStderrTailBytes = 4096;
// Far more than a reward line per item needs; a command that prints without end fails here
// instead of filling memory until its timeout.
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr size_t kChunkBytes = size_t{64} << 10;
// After the timeout, how long the command's processes get between SIGTERM and SIGKILL.
constexpr std::chrono::milliseconds kTerminateGrace{1000};

class FileDescriptor {
 public:
  FileDescriptor() = default;
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() { close(); }
  int get() const { return fd_; }
  bool isOpen() const { return fd_ >= 0; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }
  void close() { reset(-1); }

 private:
  int fd_ = -1;
};

std::string describeStatus(int status) {
  if (WIFSIGNALED(status)) {
    const int signal = WTERMSIG(status);
    const char* name = ::strsignal(signal);
    return "was killed by signal " + std::to_string(signal) + (name ? std::string(" (") + name + ")" : "");
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int millisecondsUntil(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 60 * 60 * 1000));
}

// What one run of the command left: its wait status, everything it printed on stdout, and the
// end of what it printed on stderr (between one and two times kStderrTailBytes of it).
struct CommandResult {
  int status = 0;
  std::string output;
  std::string errorTail;
  bool errorTailCut = false;
};

// "; its stderr ends: ..." when the command printed anything there.
std::string stderrNote(const CommandResult& result) {
  std::string_view tail = result.errorTail;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r' || tail.back() == ' ')) tail.remove_suffix(1);
  if (tail.empty()) return "";
  const bool cut = result.errorTailCut || tail.size() > kStderrTailBytes;
  if (tail.size() > kStderrTailBytes) tail = tail.substr(tail.size() - kStderrTailBytes);
  return std::string(cut ? "; its stderr ends: ..." : "; its stderr: ") + std::string(tail);
}

// One run of `/bin/sh -c COMMAND` in a process group of its own, fed `input` on stdin while its
// stdout and stderr are read (one poll loop over all three, so neither side blocks on a full pipe).
//
// Spawned with posix_spawn, which sets the process group (POSIX_SPAWN_SETPGROUP) and closes every
// inherited descriptor above stderr (closefrom); Boost.Process is not used because Debian's boost
// needs compiled boost libraries the project does not install. Stdin is a socket so that writes
// can pass MSG_NOSIGNAL: a command that exits without reading all of it gives EPIPE, not a SIGPIPE
// that would end dgemma. The command's exit is watched through a pidfd, and while it is not reaped
// its pid keeps its process group's id, so killing the group never reaches another process.
class CommandRun {
 public:
  CommandRun(const std::string& command, std::string prefix) : prefix_(std::move(prefix)) {
    int input[2], output[2], errors[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, input) != 0) fail("cannot create its stdin");
    input_.reset(input[0]);
    FileDescriptor childInput(input[1]);
    if (::pipe2(output, O_CLOEXEC) != 0) fail("cannot create its stdout");
    output_.reset(output[0]);
    FileDescriptor childOutput(output[1]);
    if (::pipe2(errors, O_CLOEXEC) != 0) fail("cannot create its stderr");
    errors_.reset(errors[0]);
    FileDescriptor childErrors(errors[1]);

    posix_spawn_file_actions_t actions;
    posix_spawnattr_t attributes;
    ::posix_spawn_file_actions_init(&actions);
    ::posix_spawnattr_init(&attributes);
    ::posix_spawn_file_actions_adddup2(&actions, childInput.get(), STDIN_FILENO);
    ::posix_spawn_file_actions_adddup2(&actions, childOutput.get(), STDOUT_FILENO);
    ::posix_spawn_file_actions_adddup2(&actions, childErrors.get(), STDERR_FILENO);
    ::posix_spawn_file_actions_addclosefrom_np(&actions, STDERR_FILENO + 1);
    // The command starts with default signal handling and nothing blocked, whatever dgemma set.
    sigset_t noSignals, defaults;
    sigemptyset(&noSignals);
    sigemptyset(&defaults);
    for (int signal : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD}) sigaddset(&defaults, signal);
    ::posix_spawnattr_setsigmask(&attributes, &noSignals);
    ::posix_spawnattr_setsigdefault(&attributes, &defaults);
    ::posix_spawnattr_setpgroup(&attributes, 0);
    ::posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::string shell = "/bin/sh", flag = "-c", script = command;
    char* argv[] = {shell.data(), flag.data(), script.data(), nullptr};
    const int spawned = ::posix_spawn(&pid_, "/bin/sh", &actions, &attributes, argv, environ);
    ::posix_spawn_file_actions_destroy(&actions);
    ::posix_spawnattr_destroy(&attributes);
    if (spawned != 0) {
      pid_ = -1;
      throw RuntimeError(prefix_ + ": cannot start /bin/sh: " + std::strerror(spawned));
    }
    exit_.reset(static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0)));
    if (!exit_.isOpen()) {
      const int error = errno;
      killGroupAndReap();
      throw RuntimeError(prefix_ + ": cannot watch its process (pidfd_open): " + std::strerror(error));
    }
    for (const FileDescriptor* fd : {&input_, &output_, &errors_}) ::fcntl(fd->get(), F_SETFL, O_NONBLOCK);
  }

  CommandRun(const CommandRun&) = delete;
  CommandRun& operator=(const CommandRun&) = delete;
  ~CommandRun() {
    if (pid_ > 0) killGroupAndReap();
  }

  // Feeds `input`, collects the output until the command exits and its pipes close. Throws
  // RuntimeError when that takes longer than `timeout`, after stopping the whole process group.
  CommandResult run(std::string_view input, std::chrono::milliseconds timeout) {
    const Clock::time_point deadline = Clock::now() + timeout;
    size_t written = 0;
    bool exited = false;
    if (input.empty()) input_.close();
    while (!exited || output_.isOpen() || errors_.isOpen()) {
      if (Clock::now() >= deadline) timedOut(timeout);
      pollfd fds[4];
      int count = 0;
      for (const FileDescriptor* fd : {&input_, &output_, &errors_})
        if (fd->isOpen()) fds[count++] = {fd->get(), static_cast<short>(fd == &input_ ? POLLOUT : POLLIN), 0};
      if (!exited) fds[count++] = {exit_.get(), POLLIN, 0};
      const int ready = ::poll(fds, count, millisecondsUntil(deadline));
      if (ready < 0 && errno != EINTR) fail("poll failed");
      if (ready <= 0) continue;
      for (int i = 0; i < count; ++i) {
        if (fds[i].revents == 0) continue;
        if (fds[i].fd == input_.get()) written += send(input.substr(written));
        else if (fds[i].fd == output_.get()) receive(output_, result_.output);
        else if (fds[i].fd == errors_.get()) receiveErrors();
        else if (fds[i].fd == exit_.get()) exited = true;
      }
      if (input_.isOpen() && written == input.size()) input_.close();
      if (result_.output.size() > kMaxOutputBytes) {
        killGroupAndReap();
        throw RuntimeError(prefix_ + ": printed more than " + std::to_string(kMaxOutputBytes >> 20) + " MiB on stdout" +
                           stderrNote(result_));
      }
      // Whatever the command started and left behind ends with it, and so closes the pipes.
      if (exited) ::kill(-pid_, SIGKILL);
    }
    result_.status = reap();
    return std::move(result_);
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    const int error = errno;
    throw RuntimeError(prefix_ + ": " + what + ": " + std::strerror(error));
  }

  // How many bytes of `bytes` the command took. When it has stopped reading, stdin is closed and
  // its exit status and output decide the outcome.
  size_t send(std::string_view bytes) {
    const ssize_t sent =
        ::send(input_.get(), bytes.data(), std::min(bytes.size(), kChunkBytes), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) return static_cast<size_t>(sent);
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    if (errno == EPIPE || errno == ECONNRESET) {
      input_.close();
      return 0;
    }
    fail("cannot write its stdin");
  }

  void receive(FileDescriptor& fd, std::string& into) {
    char buffer[kChunkBytes];
    const ssize_t got = ::read(fd.get(), buffer, sizeof buffer);
    if (got > 0) into.append(buffer, static_cast<size_t>(got));
    else if (got == 0) fd.close();
    else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) fail("cannot read its output");
  }

  void receiveErrors() {
    receive(errors_, result_.errorTail);
    if (result_.errorTail.size() > 2 * kStderrTailBytes) {
      result_.errorTail.erase(0, result_.errorTail.size() - kStderrTailBytes);
      result_.errorTailCut = true;
    }
  }

  [[noreturn]] void timedOut(std::chrono::milliseconds timeout) {
    // SIGTERM first, so a scorer can clean up; SIGKILL for what is left after the grace period.
    ::kill(-pid_, SIGTERM);
    pollfd exit{exit_.get(), POLLIN, 0};
    const Clock::time_point graceEnd = Clock::now() + kTerminateGrace;
    while (::poll(&exit, 1, millisecondsUntil(graceEnd)) < 0 && errno == EINTR) {
    }
    killGroupAndReap();
    throw RuntimeError(prefix_ + ": did not finish within the timeout of " + std::to_string(timeout.count()) +
                       " ms; its process group was killed" + stderrNote(result_));
  }

  void killGroupAndReap() {
    ::kill(-pid_, SIGKILL);
    reap();
  }

  int reap() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

  std::string prefix_;
  pid_t pid_ = -1;
  FileDescriptor input_, output_, errors_, exit_;
  CommandResult result_;
};

std::string counted(size_t count, const std::string& noun) {
  return std::to_string(count) + " " + noun + (count == 1 ? "" : "s");
}

// One stdin line: {"prompt": ..., "completion": ..., "reference": ...}. Text that is not valid
// UTF-8 (a completion cut inside a character) has its broken bytes replaced by U+FFFD.
void appendInputLine(const RewardItem& item, std::string& input) {
  constexpr auto kReplace = nlohmann::json::error_handler_t::replace;
  input += "{\"prompt\": " + nlohmann::json(item.prompt).dump(-1, ' ', false, kReplace);
  input += ", \"completion\": " + nlohmann::json(item.completion).dump(-1, ' ', false, kReplace);
  input += ", \"reference\": " + item.reference.dump(-1, ' ', false, kReplace) + "}\n";
}

// The output split into lines, a final line without its newline included and "\r\n" endings
// accepted.
std::vector<std::string_view> outputLines(std::string_view output) {
  std::vector<std::string_view> lines;
  while (!output.empty()) {
    const size_t end = output.find('\n');
    std::string_view line = output.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    output = end == std::string_view::npos ? std::string_view() : output.substr(end + 1);
  }
  return lines;
}

class CommandReward : public RewardFunction {
 public:
  explicit CommandReward(RewardCommandOptions options)
      : options_(std::move(options)), prefix_("reward command " + quoteForMessage(options_.command, 200)) {
    if (options_.command.empty()) throw InputError("reward command: empty command");
    if (options_.timeout.count() <= 0)
      throw InputError(prefix_ + ": the timeout must be positive, got " + std::to_string(options_.timeout.count()) +
                       " ms");
  }

  std::vector<double> score(const std::vector<RewardItem>& items) override {
    if (items.empty()) return {};
    std::string input;
    for (const RewardItem& item : items) appendInputLine(item, input);
    CommandRun run(options_.command, prefix_);
    const CommandResult result = run.run(input, options_.timeout);
    if (result.status != 0) throw RuntimeError(prefix_ + ": " + describeStatus(result.status) + stderrNote(result));
    const std::vector<std::string_view> lines = outputLines(result.output);
    if (lines.size() < items.size())
      throw RuntimeError(prefix_ + ": printed " + counted(lines.size(), "line") + " for " +
                         counted(items.size(), "item") + " (no reward for item " + items[lines.size()].where + ")" +
                         stderrNote(result));
    if (lines.size() > items.size())
      throw RuntimeError(prefix_ + ": printed " + counted(lines.size(), "line") + " for " +
                         counted(items.size(), "item") + "; expected one line per item" + stderrNote(result));
    std::vector<double> rewards;
    rewards.reserve(items.size());
    for (size_t i = 0; i < items.size(); ++i) rewards.push_back(reward(lines[i], i, items[i]));
    return rewards;
  }

  std::string name() const override { return "command"; }

 private:
  double reward(std::string_view line, size_t index, const RewardItem& item) const {
    const std::string source = prefix_ + ": output line " + std::to_string(index + 1) + " (item " + item.where + ")";
    nlohmann::json value;
    try {
      value = parseJson(line, source);
    } catch (const InputError& error) {
      throw RuntimeError(error.what());
    }
    if (!value.is_object()) throw RuntimeError(source + ": expected an object, got " + describeJsonValue(value));
    const auto found = value.find("reward");
    if (found == value.end()) throw RuntimeError(source + ": the object has no \"reward\"");
    if (!found->is_number() || !std::isfinite(found->get<double>()))
      throw RuntimeError(source + ": \"reward\": expected a finite number, got " + describeJsonValue(*found));
    return found->get<double>();
  }

  RewardCommandOptions options_;
  std::string prefix_;
};

}  // namespace

std::unique_ptr<RewardFunction> makeCommandReward(const RewardCommandOptions& options) {
  return std::make_unique<CommandReward>(options);
}

}  // namespace dgemma
