#include "runtime/train/SaveDirectoryClaim.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "support/AtomicFile.h"
#include "support/Error.h"
#include "support/Json.h"

namespace dgemma {

namespace {

namespace fs = std::filesystem;

constexpr const char* kLockFile = "dgemma-run.lock";
constexpr const char* kIdentityFile = "dgemma-run.json";

std::string listed(const std::vector<std::string>& names) {
  std::string text;
  const size_t shown = std::min<size_t>(names.size(), 4);
  for (size_t i = 0; i < shown; ++i) text += (i ? ", " : "") + names[i];
  if (names.size() > shown) text += " and " + std::to_string(names.size() - shown) + " more";
  return text;
}

std::string hostName() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "an unknown host";
  return name;
}

std::string nowText() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// What the lock file says of its holder ("pid 123 on node0 since ..., run ..."), for a refusal.
std::string holderOf(int lock) {
  std::string text(512, '\0');
  const ssize_t read = ::pread(lock, text.data(), text.size(), 0);
  text.resize(read > 0 ? static_cast<size_t>(read) : 0);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text.empty() ? "a process that has not yet said which" : text;
}

}  // namespace

std::vector<std::string> checkpointEntries(const std::string& saveDir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const fs::directory_entry& entry : fs::directory_iterator(saveDir, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step-", 0) == 0 || name.rfind(".tmp-", 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string newRunIdentity() {
  std::random_device device;
  const uint64_t value = (static_cast<uint64_t>(device()) << 32) ^ device();
  char text[32];
  std::snprintf(text, sizeof text, "run %016llx", static_cast<unsigned long long>(value));
  return text;
}

std::optional<std::string> recordedRunIdentity(const std::string& saveDir) {
  const fs::path path = fs::path(saveDir) / kIdentityFile;
  std::error_code error;
  if (!fs::is_regular_file(path, error)) return std::nullopt;
  try {
    const nlohmann::json record = parseJson(readWholeFile(path.string()), path.string());
    if (record.is_object() && record.contains("run") && record["run"].is_string()) return record["run"].get<std::string>();
  } catch (const Error&) {
  }
  return std::nullopt;
}

SaveDirectoryClaim::SaveDirectoryClaim(const SaveDirectoryRequest& request) {
  const std::string& saveDir = request.saveDir;
  std::error_code error;
  fs::create_directories(saveDir, error);
  if (error) throw RuntimeError("--save-dir " + saveDir + ": cannot create the directory: " + error.message());
  const std::string lockPath = (fs::path(saveDir) / kLockFile).string();
  lock_ = ::open(lockPath.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lock_ < 0) throw RuntimeError("--save-dir " + saveDir + ": cannot open " + lockPath + ": " + std::strerror(errno));
  if (::flock(lock_, LOCK_EX | LOCK_NB) != 0) {
    const int saved = errno;
    const std::string holder = saved == EWOULDBLOCK ? holderOf(lock_) : "";
    ::close(lock_);
    lock_ = -1;
    if (saved != EWOULDBLOCK) throw RuntimeError("--save-dir " + saveDir + ": cannot lock " + lockPath + ": " + std::strerror(saved));
    throw InputError("--save-dir " + saveDir + ": another run is saving here (" + holder +
                     "); one run saves into a directory at a time: wait for it to end, or choose another --save-dir");
  }
  try {
    const std::optional<std::string> recorded = recordedRunIdentity(saveDir);
    const std::vector<std::string> entries = checkpointEntries(saveDir);
    const bool sameRun = recorded && *recorded == request.runIdentity;
    if (!entries.empty() && !request.resuming && !sameRun) {
      if (!request.overwrite)
        throw InputError("--save-dir " + saveDir + ": holds the checkpoints of another run (" + listed(entries) +
                         (recorded ? "; " + *recorded : "") +
                         "): --resume continues that run, --overwrite deletes them and starts afresh, or choose another "
                         "--save-dir");
      for (const std::string& name : entries) {
        fs::remove_all(fs::path(saveDir) / name, error);
        if (error) throw RuntimeError("--overwrite: cannot delete " + (fs::path(saveDir) / name).string() + ": " + error.message());
      }
    }
    writeFileAtomically((fs::path(saveDir) / kIdentityFile).string(),
                        nlohmann::json{{"run", request.runIdentity}, {"started", nowText()}, {"host", hostName()},
                                       {"pid", static_cast<int64_t>(::getpid())}}.dump(2) + "\n");
    const std::string holder = "pid " + std::to_string(::getpid()) + " on " + hostName() + " since " + nowText() + ", " +
                               request.runIdentity + "\n";
    if (::ftruncate(lock_, 0) != 0 || ::pwrite(lock_, holder.data(), holder.size(), 0) != static_cast<ssize_t>(holder.size()))
      throw RuntimeError("--save-dir " + saveDir + ": cannot write " + lockPath + ": " + std::strerror(errno));
  } catch (...) {
    ::close(lock_);
    lock_ = -1;
    throw;
  }
}

SaveDirectoryClaim::~SaveDirectoryClaim() {
  if (lock_ >= 0) ::close(lock_);
}

}  // namespace dgemma
