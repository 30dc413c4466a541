// Scoring commands (docs/rl.md, "Rewards"): a python3 scorer of exact match, a batch large
// enough to deadlock a writer that does not read at the same time, and every way a command fails:
// its exit code, a hang past the timeout, garbage, too few or too many lines, a reward that is not
// a finite number, a command that does not exist.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/rl/reward/RewardCommand.h"
#include "test/unit/TestSupport.h"

namespace dgemma {
namespace {

using test::mentions;
using test::TempDir;
using test::writeBytes;

// Scores exact match of the trimmed completion and reference, echoing the prompt's length and a
// padding key so that its output is as large as its input.
constexpr const char* kExactScorer = R"(import json, sys
for line in sys.stdin:
    item = json.loads(line)
    reference = item["reference"]
    if not isinstance(reference, str):
        reference = json.dumps(reference)
    same = item["completion"].strip() == reference.strip()
    print(json.dumps({"reward": 1.0 if same else 0.0, "prompt_chars": len(item["prompt"]),
                      "padding": item["completion"][:1000]}))
)";

// The message of the RuntimeError `f` throws; a test failure if it throws none.
std::string expectRuntimeError(const std::function<void()>& f) {
  try {
    f();
  } catch (const RuntimeError& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a RuntimeError, got: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected a RuntimeError";
  return "";
}

std::vector<RewardItem> itemsOf(const std::vector<std::pair<std::string, nlohmann::json>>& completions) {
  std::vector<RewardItem> items;
  for (size_t i = 0; i < completions.size(); ++i)
    items.push_back({"prompt " + std::to_string(i), completions[i].first, completions[i].second,
                     "rows.jsonl:" + std::to_string(i + 1)});
  return items;
}

std::vector<double> scoreWith(const std::string& command, const std::vector<RewardItem>& items,
                              std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
  RewardCommandOptions options;
  options.command = command;
  options.timeout = timeout;
  return makeCommandReward(options)->score(items);
}

bool processRuns(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno != ESRCH;
  // An orphan that has died but not yet been reaped by init no longer runs.
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pidField, name, state;
  stat >> pidField >> name >> state;
  return stat && state != "Z";
}

TEST(CommandReward, PythonScorerOfExactMatch) {
  TempDir dir;
  writeBytes(dir / "score.py", kExactScorer);
  const std::vector<RewardItem> items = itemsOf(
      {{" Paris\n", "Paris"}, {"Lyon", "Paris"}, {"42", 42}, {"caf\xc3\xa9", "caf\xc3\xa9"}, {"cut \xc3", "cut"}});
  const auto reward = makeCommandReward({"python3 " + dir / "score.py"});
  EXPECT_EQ(reward->name(), "command");
  EXPECT_EQ(reward->score(items), (std::vector<double>{1, 0, 1, 1, 0}));
  EXPECT_TRUE(reward->score({}).empty());
}

TEST(CommandReward, SeesThePromptCompletionAndReferenceAsJsonLines) {
  TempDir dir;
  const std::vector<RewardItem> items = {{"a \"quoted\"\nprompt", "done\ttoo", {{"tests", {1, 2}}}, "rows.jsonl:9"}};
  EXPECT_EQ(scoreWith("tee " + dir / "input.jsonl" + " >/dev/null; echo '{\"reward\": 0.25}'", items),
            (std::vector<double>{0.25}));
  EXPECT_EQ(test::fileBytes(dir / "input.jsonl"),
            "{\"prompt\": \"a \\\"quoted\\\"\\nprompt\", \"completion\": \"done\\ttoo\", "
            "\"reference\": {\"tests\":[1,2]}}\n");
}

TEST(CommandReward, LargeBatchDoesNotDeadlock) {
  TempDir dir;
  writeBytes(dir / "score.py", kExactScorer);
  std::vector<std::pair<std::string, nlohmann::json>> completions;
  std::vector<double> expected;
  for (int i = 0; i < 2000; ++i) {
    const std::string answer = std::string(8000, static_cast<char>('a' + i % 26)) + std::to_string(i);
    const bool right = i % 3 == 0;
    completions.push_back({answer, right ? answer : answer + "x"});
    expected.push_back(right ? 1 : 0);
  }
  EXPECT_EQ(scoreWith("python3 " + dir / "score.py", itemsOf(completions)), expected);
}

TEST(CommandReward, CommandThatExitsEarlyDoesNotKillUsWithSigpipe) {
  // It prints its one line without reading 8 MB of stdin: the write fails (EPIPE), the run does not.
  const std::vector<RewardItem> items = itemsOf({{std::string(8 << 20, 'x'), "x"}});
  EXPECT_EQ(scoreWith("echo '{\"reward\": 1}'", items), (std::vector<double>{1}));
  const std::string message = expectRuntimeError([&] { scoreWith("exit 4", items); });
  EXPECT_TRUE(mentions(message, "exited with code 4"));
}

TEST(CommandReward, InheritsNoStrayDescriptors) {
  const int stray = ::open("/dev/null", O_RDONLY);  // not close-on-exec
  ASSERT_GE(stray, 0);
  const std::string fd = "/proc/$$/fd/" + std::to_string(stray);
  const std::vector<double> rewards = scoreWith(
      "if [ -e " + fd + " ]; then echo '{\"reward\": 1}'; else echo '{\"reward\": 0}'; fi", itemsOf({{"a", "a"}}));
  ::close(stray);
  EXPECT_EQ(rewards, (std::vector<double>{0}));
}

TEST(CommandReward, NonZeroExitNamesTheCodeAndStderr) {
  const std::string message = expectRuntimeError(
      [] { scoreWith("echo 'scorer: no such dataset' >&2; exit 3", itemsOf({{"a", "a"}, {"b", "b"}})); });
  EXPECT_TRUE(mentions(message, "reward command \"echo 'scorer: no such dataset' >&2; exit 3\""));
  EXPECT_TRUE(mentions(message, "exited with code 3"));
  EXPECT_TRUE(mentions(message, "scorer: no such dataset"));
}

TEST(CommandReward, DeathBySignalIsNamed) {
  const std::string message = expectRuntimeError([] { scoreWith("kill -9 $$", itemsOf({{"a", "a"}})); });
  EXPECT_TRUE(mentions(message, "killed by signal 9"));
}

TEST(CommandReward, StderrKeepsItsTail) {
  const std::string message = expectRuntimeError([] {
    scoreWith("python3 -c \"import sys; sys.stderr.write('x' * 100000 + 'THE END'); sys.exit(1)\"",
              itemsOf({{"a", "a"}}));
  });
  EXPECT_TRUE(mentions(message, "its stderr ends: ..."));
  EXPECT_TRUE(mentions(message, "THE END"));
  EXPECT_LT(message.size(), 4096u + 200u);
}

TEST(CommandReward, HangIsKilledAtTheTimeout) {
  TempDir dir;
  const std::string pids = dir / "pids";
  const auto start = std::chrono::steady_clock::now();
  const std::string message = expectRuntimeError([&] {
    scoreWith("echo $$ > " + pids + "; sleep 30 & echo $! >> " + pids + "; wait", itemsOf({{"a", "a"}}),
              std::chrono::milliseconds(500));
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_TRUE(mentions(message, "did not finish within the timeout of 500 ms"));
  EXPECT_GE(elapsed, std::chrono::milliseconds(500));
  EXPECT_LT(elapsed, std::chrono::milliseconds(2500));
  std::ifstream stream(pids);
  pid_t shell = 0, sleeper = 0;
  stream >> shell >> sleeper;
  ASSERT_GT(shell, 0);
  ASSERT_GT(sleeper, 0);
  EXPECT_FALSE(processRuns(shell));  // reaped: no zombie left behind either
  EXPECT_EQ(::kill(shell, 0), -1);
  // The sleep was in the command's process group; its parent is gone, so init reaps it.
  for (int i = 0; i < 100 && processRuns(sleeper); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(processRuns(sleeper));
}

TEST(CommandReward, GarbageLineNamesTheLineAndItem) {
  const std::string message = expectRuntimeError(
      [] { scoreWith("echo '{\"reward\": 1}'; echo 'all good'", itemsOf({{"a", "a"}, {"b", "b"}})); });
  EXPECT_TRUE(mentions(message, "output line 2 (item rows.jsonl:2)"));
  EXPECT_TRUE(mentions(message, "invalid JSON"));
}

TEST(CommandReward, LinesThatAreNotRewardObjects) {
  const auto items = itemsOf({{"a", "a"}});
  EXPECT_TRUE(mentions(expectRuntimeError([&] { scoreWith("echo '[1]'", items); }),
                       "output line 1 (item rows.jsonl:1): expected an object"));
  EXPECT_TRUE(mentions(expectRuntimeError([&] { scoreWith("echo '{\"score\": 1}'", items); }), "no \"reward\""));
  EXPECT_TRUE(mentions(expectRuntimeError([&] { scoreWith("echo '{\"reward\": true}'", items); }),
                       "\"reward\": expected a finite number"));
  EXPECT_TRUE(mentions(expectRuntimeError([&] { scoreWith("echo", items); }), "output line 1 (item rows.jsonl:1)"));
}

TEST(CommandReward, NonFiniteRewardIsAnError) {
  const auto items = itemsOf({{"a", "a"}});
  EXPECT_TRUE(mentions(expectRuntimeError([&] { scoreWith("echo '{\"reward\": \"nan\"}'", items); }),
                       "output line 1 (item rows.jsonl:1): \"reward\": expected a finite number, got \"nan\""));
  // JSON has no infinity: a number past the double range is refused while the line is read.
  for (const std::string line : {"{\"reward\": 1e999}", "{\"reward\": -1e999}"}) {
    const std::string message = expectRuntimeError([&] { scoreWith("echo '" + line + "'", items); });
    EXPECT_TRUE(mentions(message, "output line 1 (item rows.jsonl:1): invalid JSON"));
    EXPECT_TRUE(mentions(message, "overflow"));
  }
}

TEST(CommandReward, TooFewLines) {
  const std::string message =
      expectRuntimeError([] { scoreWith("echo '{\"reward\": 1}'", itemsOf({{"a", "a"}, {"b", "b"}, {"c", "c"}})); });
  EXPECT_TRUE(mentions(message, "printed 1 line for 3 items"));
  EXPECT_TRUE(mentions(message, "rows.jsonl:2"));
}

TEST(CommandReward, TooManyLines) {
  const std::string message =
      expectRuntimeError([] { scoreWith("printf '{\"reward\": 1}\\n{\"reward\": 0}\\n'", itemsOf({{"a", "a"}})); });
  EXPECT_TRUE(mentions(message, "printed 2 lines for 1 item"));
}

TEST(CommandReward, LastLineNeedsNoNewline) {
  EXPECT_EQ(scoreWith("printf '{\"reward\": 1}\\r\\n{\"reward\": -0.5}'", itemsOf({{"a", "a"}, {"b", "b"}})),
            (std::vector<double>{1, -0.5}));
}

TEST(CommandReward, MissingCommandExits127) {
  const std::string message =
      expectRuntimeError([] { scoreWith("dgemma-no-such-scorer --flag", itemsOf({{"a", "a"}})); });
  EXPECT_TRUE(mentions(message, "exited with code 127"));
  EXPECT_TRUE(mentions(message, "not found"));
}

TEST(CommandReward, BadOptionsAreInputErrors) {
  EXPECT_TRUE(mentions(test::expectInputError([] { makeCommandReward({""}); }), "empty command"));
  EXPECT_TRUE(mentions(test::expectInputError([] { makeCommandReward({"true", std::chrono::milliseconds(0)}); }),
                       "timeout must be positive"));
}

}  // namespace
}  // namespace dgemma
