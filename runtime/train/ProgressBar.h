// The progress display of `dgemma-run train`: step/total, loss, lr, gradient norm, tokens/s and ETA.
//
//  - On a terminal one line is redrawn in place ('\r', padded with spaces over a longer previous
//    line), with a bar:
//      [#######.................]  12/40  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 1m10s
//  - Otherwise (a log file, CI) whole lines, no control characters, rate-limited:
//      step 12/40  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 1m10s
//    A line is printed for the first update, the last step, every `everySteps` steps, and when
//    `minIntervalSeconds` have passed since the previous line (when both are 0, every update).
//
// The clock is the caller's (ProgressUpdate::elapsedSeconds), so output is a function of the
// updates and testable. ETA = elapsed / (step − firstStep) · (total − step): the mean time per step
// of this process, which counts from the resumed step.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

namespace dgemma {

struct ProgressOptions {
  int64_t totalSteps = 0;
  int64_t firstStep = 0;             // the step this process starts after (a resumed checkpoint's)
  bool isTty = false;                // e.g. isatty(fileno(stderr))
  double minIntervalSeconds = 30.0;  // plain lines: at most one per this many seconds ...
  int64_t everySteps = 0;            // ... plus one every this many steps (0: none)
  double minRedrawSeconds = 0.1;     // terminal: redraw at most this often (the last step always)
  int barWidth = 24;
};

struct ProgressUpdate {
  int64_t step = 0;               // the optimizer step just finished, 1-based
  double loss = 0.0;
  double lr = 0.0;
  double gradNorm = 0.0;
  double tokensPerSecond = 0.0;
  double elapsedSeconds = 0.0;    // since this process started training
};

// "12/40  loss 2.3164  lr 2.500e-06  grad-norm 0.870  tok/s 24.6k  ETA 1m10s" (the fields both
// forms share). ETA "?" before any step of this process has finished.
std::string formatProgressFields(const ProgressUpdate& update, const ProgressOptions& options);
// "45s", "12m05s", "3h02m05s", "2d03h"; "?" for a negative or non-finite value.
std::string formatDuration(double seconds);
// "950", "24.6k", "1.25M".
std::string formatRate(double perSecond);

class ProgressBar {
 public:
  ProgressBar(std::ostream& out, const ProgressOptions& options);
  ~ProgressBar();  // finish()

  void update(const ProgressUpdate& update);
  // A line of its own ("saved checkpoint ..."), above the bar on a terminal.
  void message(const std::string& line);
  // Terminal: ends the bar's line. Plain: prints the last update if the rate limit held it back.
  // Idempotent.
  void finish();

 private:
  void draw(const ProgressUpdate& update);

  std::ostream& out_;
  ProgressOptions options_;
  bool haveUpdate_ = false;
  bool lastPrinted_ = false;  // the latest update has been shown
  bool barOnScreen_ = false;  // terminal: a bar line is open (no newline yet)
  bool anyPrinted_ = false;
  double lastPrintSeconds_ = 0.0;
  size_t lastWidth_ = 0;
  ProgressUpdate latest_;
};

}  // namespace dgemma
