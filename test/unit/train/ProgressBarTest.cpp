#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/train/ProgressBar.h"

namespace dgemma {
namespace {

ProgressUpdate at(int64_t step, double elapsed) {
  return {.step = step, .loss = 2.31640625, .lr = 2.5e-6, .gradNorm = 0.87, .tokensPerSecond = 24600, .elapsedSeconds = elapsed};
}

std::vector<std::string> linesOf(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

TEST(ProgressBarTest, Durations) {
  EXPECT_EQ(formatDuration(0), "0s");
  EXPECT_EQ(formatDuration(45.4), "45s");
  EXPECT_EQ(formatDuration(59.6), "1m00s");
  EXPECT_EQ(formatDuration(725), "12m05s");
  EXPECT_EQ(formatDuration(3 * 3600 + 2 * 60 + 5), "3h02m05s");
  EXPECT_EQ(formatDuration(2 * 86400 + 3 * 3600 + 59), "2d03h");
  EXPECT_EQ(formatDuration(-1), "?");
  EXPECT_EQ(formatDuration(NAN), "?");
}

TEST(ProgressBarTest, Rates) {
  EXPECT_EQ(formatRate(950), "950");
  EXPECT_EQ(formatRate(24600), "24.6k");
  EXPECT_EQ(formatRate(1.25e6), "1.25M");
  EXPECT_EQ(formatRate(-1), "?");
}

TEST(ProgressBarTest, Fields) {
  ProgressOptions options{.totalSteps = 1000};
  // 12 steps in 36 s: 3 s a step, 988 to go.
  EXPECT_EQ(formatProgressFields(at(12, 36), options),
            "  12/1000  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 49m24s");
  // Resumed at step 500: the rate counts this process's steps only (10 in 20 s).
  options.firstStep = 500;
  EXPECT_EQ(formatProgressFields(at(510, 20), options),
            " 510/1000  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 16m20s");
  EXPECT_NE(formatProgressFields(at(500, 0), options).find("ETA ?"), std::string::npos);
  ProgressUpdate nan = at(12, 36);
  nan.loss = NAN;
  EXPECT_NE(formatProgressFields(nan, options).find("loss nan"), std::string::npos);
}

TEST(ProgressBarTest, PlainLinesAreRateLimitedByTime) {
  std::ostringstream out;
  {
    ProgressBar bar(out, {.totalSteps = 10, .isTty = false, .minIntervalSeconds = 10.0});
    for (int64_t step = 1; step <= 10; ++step) bar.update(at(step, 3.0 * static_cast<double>(step)));
  }
  // Steps take 3 s: step 1 (the first, at 3 s), 5 (15 s: 10 s after it), 9 (27 s), 10 (the last).
  std::vector<std::string> lines = linesOf(out.str());
  ASSERT_EQ(lines.size(), 4u) << out.str();
  EXPECT_EQ(lines[0].rfind("step  1/10  loss", 0), 0u) << lines[0];
  EXPECT_EQ(lines[1].rfind("step  5/10", 0), 0u) << lines[1];
  EXPECT_EQ(lines[2].rfind("step  9/10", 0), 0u) << lines[2];
  EXPECT_EQ(lines[3].rfind("step 10/10", 0), 0u) << lines[3];
  EXPECT_EQ(out.str().find('\r'), std::string::npos);
}

TEST(ProgressBarTest, PlainLinesEveryKSteps) {
  std::ostringstream out;
  ProgressBar bar(out, {.totalSteps = 100, .isTty = false, .minIntervalSeconds = 0, .everySteps = 25});
  for (int64_t step = 1; step <= 60; ++step) bar.update(at(step, 0.1 * static_cast<double>(step)));
  EXPECT_EQ(linesOf(out.str()).size(), 3u);  // 1, 25, 50
  bar.finish();                              // 60 was held back: shown now, once
  bar.finish();
  std::vector<std::string> lines = linesOf(out.str());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[3].rfind("step  60/100", 0), 0u) << lines[3];
}

TEST(ProgressBarTest, PlainLinesEveryUpdateWhenUnlimited) {
  std::ostringstream out;
  ProgressBar bar(out, {.totalSteps = 5, .isTty = false, .minIntervalSeconds = 0, .everySteps = 0});
  for (int64_t step = 1; step <= 5; ++step) bar.update(at(step, 0.0));
  EXPECT_EQ(linesOf(out.str()).size(), 5u);
}

TEST(ProgressBarTest, TerminalRedrawsOneLine) {
  std::ostringstream out;
  ProgressBar bar(out, {.totalSteps = 4, .isTty = true, .minRedrawSeconds = 0, .barWidth = 8});
  bar.update(at(1, 1.0));
  EXPECT_EQ(out.str(), "\r[##......]  1/4  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 3s");
  out.str("");
  ProgressUpdate shorter = at(2, 2.0);
  shorter.tokensPerSecond = 5;  // a shorter line: spaces cover the rest of the old one
  bar.update(shorter);
  std::string expected = "\r[####....]  2/4  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 5  ETA 2s";
  EXPECT_EQ(out.str(), expected + std::string(4, ' '));

  out.str("");
  bar.message("saved checkpoint step-00000002");
  std::string text = out.str();
  std::string cleared(1, '\r');
  cleared.append(expected.size() - 1, ' ').append("\rsaved checkpoint step-00000002\n");
  EXPECT_EQ(text.find(cleared), 0u) << text;
  EXPECT_NE(text.find("\r[####....]  2/4"), std::string::npos);  // the bar again, below

  out.str("");
  bar.update(at(4, 4.0));
  bar.finish();
  EXPECT_EQ(out.str(), "\r[########]  4/4  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 0s\n");
}

TEST(ProgressBarTest, TerminalRedrawIsRateLimitedButTheLastStepShows) {
  std::ostringstream out;
  {
    ProgressBar bar(out, {.totalSteps = 1000, .isTty = true, .minRedrawSeconds = 1.0, .barWidth = 4});
    for (int64_t step = 1; step <= 1000; ++step) bar.update(at(step, 0.001 * static_cast<double>(step)));
  }
  std::string text = out.str();
  size_t draws = 0;
  for (char c : text) draws += c == '\r';
  EXPECT_EQ(draws, 2u);  // step 1 and step 1000
  EXPECT_NE(text.find("1000/1000"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
}

TEST(ProgressBarTest, MessagesWithoutABarArePlainLines) {
  std::ostringstream out;
  ProgressBar bar(out, {.totalSteps = 3, .isTty = true});
  bar.message("loading checkpoint");
  EXPECT_EQ(out.str(), "loading checkpoint\n");
}

}  // namespace
}  // namespace dgemma
