#include "runtime/train/ProgressBar.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace dgemma {

namespace {

// printf into a std::string: the C locale's formatting whatever the stream's locale is.
template <typename... Args>
std::string printed(const char* format, Args... args) {
  char text[64];
  std::snprintf(text, sizeof text, format, args...);
  return text;
}

}  // namespace

std::string formatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  auto total = static_cast<long long>(std::llround(seconds));
  long long days = total / 86400, hours = total / 3600 % 24, minutes = total / 60 % 60, secs = total % 60;
  if (days > 0) return printed("%lldd%02lldh", days, hours);
  if (total >= 3600) return printed("%lldh%02lldm%02llds", hours, minutes, secs);
  if (total >= 60) return printed("%lldm%02llds", minutes, secs);
  return printed("%llds", secs);
}

std::string formatRate(double perSecond) {
  if (!std::isfinite(perSecond) || perSecond < 0) return "?";
  if (perSecond < 999.5) return printed("%.0f", perSecond);
  if (perSecond < 999.5e3) return printed("%.1fk", perSecond / 1e3);
  return printed("%.2fM", perSecond / 1e6);
}

std::string formatProgressFields(const ProgressUpdate& u, const ProgressOptions& options) {
  int width = static_cast<int>(std::to_string(std::max<int64_t>(options.totalSteps, 0)).size());
  std::string text = printed("%*lld/%lld", width, static_cast<long long>(u.step), static_cast<long long>(options.totalSteps));
  text += printed("  loss %.4f", u.loss);
  text += printed("  lr %.3e", u.lr);
  text += printed("  grad-norm %.3f", u.gradNorm);
  text += "  tok/s " + formatRate(u.tokensPerSecond);
  int64_t done = u.step - options.firstStep;
  double eta = done > 0 ? u.elapsedSeconds / static_cast<double>(done) * static_cast<double>(options.totalSteps - u.step)
                        : -1.0;
  text += "  ETA " + formatDuration(eta);
  return text;
}

ProgressBar::ProgressBar(std::ostream& out, const ProgressOptions& options) : out_(out), options_(options) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(const ProgressUpdate& update) {
  latest_ = update;
  haveUpdate_ = true;
  const ProgressOptions& o = options_;
  bool last = o.totalSteps > 0 && update.step >= o.totalSteps;
  double sinceLast = update.elapsedSeconds - lastPrintSeconds_;
  bool due;
  if (o.isTty) {
    due = !anyPrinted_ || last || sinceLast >= o.minRedrawSeconds;
  } else {
    due = !anyPrinted_ || last || (o.everySteps > 0 && update.step % o.everySteps == 0) ||
          (o.minIntervalSeconds > 0 && sinceLast >= o.minIntervalSeconds) ||
          (o.everySteps <= 0 && o.minIntervalSeconds <= 0);
  }
  if (due) draw(update);
  else lastPrinted_ = false;
}

void ProgressBar::draw(const ProgressUpdate& update) {
  std::string fields = formatProgressFields(update, options_);
  if (options_.isTty) {
    int width = std::max(options_.barWidth, 1);
    double fraction = options_.totalSteps > 0 ? static_cast<double>(update.step) / static_cast<double>(options_.totalSteps) : 0.0;
    int filled = static_cast<int>(std::lround(std::clamp(fraction, 0.0, 1.0) * width));
    std::string line(1, '[');
    line.append(filled, '#').append(width - filled, '.').append("]  ").append(fields);
    size_t visible = line.size();
    // Spaces cover what a longer previous line left on screen (no terminal escape codes needed).
    if (line.size() < lastWidth_) line.append(lastWidth_ - line.size(), ' ');
    out_ << '\r' << line << std::flush;
    lastWidth_ = visible;
    barOnScreen_ = true;
  } else {
    out_ << "step " << fields << '\n' << std::flush;
  }
  lastPrintSeconds_ = update.elapsedSeconds;
  anyPrinted_ = true;
  lastPrinted_ = true;
}

void ProgressBar::message(const std::string& line) {
  if (options_.isTty && barOnScreen_) {
    out_ << '\r' << std::string(lastWidth_, ' ') << '\r' << line << '\n';
    lastWidth_ = 0;
    barOnScreen_ = false;
    if (haveUpdate_) draw(latest_);  // the bar again, below the message
  } else {
    out_ << line << '\n' << std::flush;
  }
}

void ProgressBar::finish() {
  if (haveUpdate_ && !lastPrinted_) draw(latest_);
  if (options_.isTty && barOnScreen_) out_ << '\n' << std::flush;
  barOnScreen_ = false;
  lastWidth_ = 0;
}

}  // namespace dgemma
