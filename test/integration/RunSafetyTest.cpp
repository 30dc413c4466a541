// A run never destroys what it reads or what another run saved, and leaves no rank behind
// (docs/cli.md, "Outputs and inputs"; docs/training.md, "Checkpoints": one run per save directory;
// docs/cli.md, "Several ranks"): each case was found losing data, orphaning ranks or hanging.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "ToolRunner.h"

namespace dgemma {
namespace {

using testing::contains;
using testing::runTool;
using testing::ScratchDirectory;
using testing::ToolResult;

namespace fs = std::filesystem;
using namespace std::chrono_literals;

const std::string kRun = std::string("timeout 120 ") + DGEMMA_RUN;

std::string readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The tiny CPU model's training plans, one and two data-parallel ranks, compiled once.
class RunSafetyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string((fs::temp_directory_path() / ("dgemma-run-safety-" + std::to_string(::getpid()))).string());
    fs::remove_all(*root_);
    fs::create_directories(*root_);
    for (const auto& [name, flags] : {std::pair{"plan", ""}, std::pair{"plan-dp2", " --dp 2"}}) {
      ToolResult compiled = runTool(std::string(DGEMMA_COMPILE) + " --model " + DGEMMA_SOURCE_DIR +
                                    "/models/diffusion_gemma/configs/tiny-cpu.json --mode train --micro-batch 2 --prompt-len 32" +
                                    flags + " -o " + *root_ + "/" + name);
      ASSERT_EQ(compiled.exitCode, 0) << compiled.output;
    }
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  static std::string plan(const std::string& name = "plan") { return *root_ + "/" + name; }

  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return dir / name;
  }
  // A mock-data training command on the one-rank plan; `extra` adds flags.
  // A resumed run repeats the schedule, so every run here decays over the same --decay-steps.
  std::string train(const std::string& extra) {
    return kRun + " train --plan " + plan() + " --init random --seed 3 --train mock --decay-steps 100000 " + extra;
  }

  static std::string* root_;
  ScratchDirectory dir;
};

std::string* RunSafetyTest::root_ = nullptr;

TEST_F(RunSafetyTest, AnOutputNamingAnInputIsRefusedBeforeAnyWork) {
  const std::string rows = R"({"messages": [{"role": "user", "content": "hi"}], "completion": "x"})" "\n";
  const std::string data = write("train.jsonl", rows);
  const std::string validation = write("validation.jsonl", rows + rows);
  fs::create_symlink(validation, dir / "metrics-link.jsonl");
  const std::string tokenizer = std::string(" --tokenizer ") + DGEMMA_SOURCE_DIR + "/data/tokenizer";
  const std::string base = kRun + " train --plan " + plan() + " --init random --steps 1" + tokenizer;
  // A hard link to the plan's rank file, outside the plan directory.
  fs::create_hard_link(plan() + "/rank-0.dgplan", dir / "plan-link.dgplan");
  const std::string planBytes = readFile(plan() + "/rank-0.dgplan");

  const std::vector<std::pair<std::string, std::string>> cases = {
      {base + " --train " + data + " --metrics " + data, "--metrics " + data + ": is the same file as --train " + data},
      {base + " --train " + data + " --validation " + validation + " --metrics " + (dir / "metrics-link.jsonl"),
       "is the same file as --validation " + validation},
      {base + " --train " + data + " --metrics " + plan() + "/rank-0.dgplan", "lies in the input directory of --plan " + plan()},
      {base + " --train " + data + " --metrics " + (dir / "plan-link.dgplan"), "is the same file as --plan " + plan() + ": its file"},
      {base + " --train " + data + " --tensorboard " + plan(), "--tensorboard " + plan() + ": is the same file as --plan"},
      {base + " --train " + data + " --tensorboard " + plan() + "/events", "--tensorboard " + plan() + "/events: lies in the input directory of --plan"},
      {base + " --train " + data + " --metrics " + (dir / "same") + " --tensorboard " + (dir / "same"),
       "--tensorboard " + (dir / "same") + ": is also the output of --metrics"},
      {kRun + " eval --plan " + plan() + " --weights " + plan() + tokenizer + " --test " + data + " --out " + data,
       "--out " + data + ": is the same file as --test " + data},
      {kRun + " forward --plan " + plan() + " --init random --input " + data + " --out " + data,
       "--out " + data + ": is the same file as --input " + data},
  };
  for (const auto& [command, message] : cases) {
    ToolResult result = runTool(command);
    EXPECT_EQ(result.exitCode, 2) << command << "\n" << result.output;
    EXPECT_TRUE(contains(result, message)) << command << "\n" << result.output;
  }
  EXPECT_EQ(readFile(data), rows);
  EXPECT_EQ(readFile(validation), rows + rows);
  EXPECT_EQ(readFile(plan() + "/rank-0.dgplan"), planBytes);
}

TEST_F(RunSafetyTest, AFreshRunDoesNotMixWithAnotherRunsCheckpoints) {
  const std::string save = dir / "save";
  ASSERT_EQ(runTool(train("--steps 2 --save-dir " + save + " --save-every 1")).exitCode, 0);
  ToolResult second = runTool(train("--steps 3 --save-dir " + save + " --save-every 1"));
  EXPECT_EQ(second.exitCode, 2) << second.output;
  EXPECT_TRUE(contains(second, "--save-dir " + save + ": holds the checkpoints of another run (step-00000001, step-00000002; run "))
      << second.output;
  EXPECT_TRUE(contains(second, "--resume continues that run, --overwrite deletes them")) << second.output;
  EXPECT_FALSE(fs::exists(save + "/step-00000003"));

  ToolResult resumed = runTool(train("--steps 3 --save-dir " + save + " --save-every 1 --resume"));
  EXPECT_EQ(resumed.exitCode, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(save + "/step-00000003"));

  ToolResult overwritten = runTool(train("--steps 1 --save-dir " + save + " --overwrite"));
  EXPECT_EQ(overwritten.exitCode, 0) << overwritten.output;
  EXPECT_TRUE(fs::exists(save + "/step-00000001"));
  EXPECT_FALSE(fs::exists(save + "/step-00000002"));
  EXPECT_FALSE(fs::exists(save + "/step-00000003"));

  // --overwrite never deletes the checkpoint the run starts from.
  ToolResult fromItself = runTool(kRun + " train --plan " + plan() + " --weights " + save + "/step-00000001 --train mock --steps 1 --save-dir " +
                                  save + " --overwrite");
  EXPECT_EQ(fromItself.exitCode, 2) << fromItself.output;
  EXPECT_TRUE(contains(fromItself, "--overwrite: --weights " + save + "/step-00000001 lies in " + save + "/step-00000001, which "
                                   "--overwrite would delete"))
      << fromItself.output;
  EXPECT_TRUE(fs::exists(save + "/step-00000001/manifest.json"));

  ToolResult both = runTool(train("--steps 1 --save-dir " + save + " --overwrite --resume"));
  EXPECT_EQ(both.exitCode, 2) << both.output;
  EXPECT_TRUE(contains(both, "--overwrite: deletes the checkpoints that --resume and --resume-from continue")) << both.output;
}

// Waits (at most `limit`) until `done` holds.
template <typename Condition>
bool waitFor(Condition done, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// Starts `command` through sh in its own process group; returns the shell's pid, which execs it.
pid_t start(const std::string& command, const std::map<std::string, std::string>& environment = {}) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    for (const auto& [name, value] : environment) ::setenv(name.c_str(), value.c_str(), 1);
    ::execl("/bin/sh", "sh", "-c", ("exec " + command + " >/dev/null 2>&1").c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  const size_t close = text.rfind(')');
  return !text.empty() && close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> children;
  for (const fs::directory_entry& task : fs::directory_iterator("/proc/" + std::to_string(parent) + "/task")) {
    std::ifstream list(task.path() / "children");
    for (pid_t child; list >> child;) children.push_back(child);
  }
  return children;
}

TEST_F(RunSafetyTest, ASecondLiveRunIsRefusedNamingTheHolderAndACrashLeavesNoLock) {
  const std::string save = dir / "save";
  const pid_t first = start(DGEMMA_RUN + std::string(" train --plan ") + plan() +
                            " --init random --seed 3 --train mock --decay-steps 100000 --steps 100000 --save-dir " + save + " --save-every 1");
  ASSERT_TRUE(waitFor([&] { return fs::exists(save + "/step-00000001"); }, 60s));
  ToolResult second = runTool(train("--steps 2 --save-dir " + save + " --resume"));
  EXPECT_EQ(second.exitCode, 2) << second.output;
  EXPECT_TRUE(contains(second, "--save-dir " + save + ": another run is saving here (pid ")) << second.output;
  EXPECT_TRUE(contains(second, "one run saves into a directory at a time")) << second.output;
  ::kill(first, SIGKILL);
  int status = 0;
  ::waitpid(first, &status, 0);
  // The kernel released the killed run's lock: its checkpoints resume.
  int64_t newest = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(save))
    if (entry.path().filename().string().rfind("step-", 0) == 0)
      newest = std::max<int64_t>(newest, std::stoll(entry.path().filename().string().substr(5)));
  ToolResult resumed = runTool(train("--steps " + std::to_string(newest + 1) + " --save-dir " + save + " --resume"));
  EXPECT_EQ(resumed.exitCode, 0) << resumed.output;
}

// kill -KILL and kill -HUP of the --nproc-per-node launcher left both ranks training under PID 1,
// and the rendezvous directory behind.
TEST_F(RunSafetyTest, RanksDieWithTheirLauncherAndLeaveNoRendezvousDirectory) {
  for (const int signal : {SIGKILL, SIGHUP}) {
    const std::string tmp = dir / ("tmp-" + std::to_string(signal));
    fs::create_directories(tmp);
    const std::string metrics = dir / ("metrics-" + std::to_string(signal) + ".jsonl");
    const pid_t launcher = start(DGEMMA_RUN + std::string(" train --plan ") + plan("plan-dp2") +
                                     " --init random --seed 3 --train mock --steps 100000 --nproc-per-node 2 --metrics " + metrics,
                                 {{"TMPDIR", tmp}});
    ASSERT_TRUE(waitFor([&] { return !readFile(metrics).empty(); }, 60s)) << "signal " << signal;
    const std::vector<pid_t> ranks = childrenOf(launcher);
    ASSERT_EQ(ranks.size(), 2u) << "signal " << signal;
    // The ranks met and rank 0 removed the rendezvous directory already.
    EXPECT_TRUE(fs::is_empty(tmp)) << "signal " << signal;
    ::kill(launcher, signal);
    int status = 0;
    ::waitpid(launcher, &status, 0);
    for (const pid_t rank : ranks) EXPECT_TRUE(waitFor([&] { return !alive(rank); }, 20s)) << "rank pid " << rank << ", signal " << signal;
    EXPECT_TRUE(fs::is_empty(tmp)) << "signal " << signal;
  }
}

}  // namespace
}  // namespace dgemma
